"""The pages over the remote transport: the same page tests, with the app a client of a real model server.

`python -m engine serve` runs the tiny model in its own process; the app (AppTest, in this process) reaches it only
through PLAYGROUND_ENGINE_URL, so every generation, capture, measurement job and quick computation below crosses
HTTP. The tests are the in-process ones, imported: one set of expectations for both transports.
"""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from servers import app_env, model_server  # noqa: F401 - the fixtures: the app as a client of a model server
from test_explainer_pages import (page, test_attention_math_page_walks_one_head,  # noqa: F401
                                  test_flash_attention_page_measures_eager_against_fused,
                                  test_kv_on_off_page_generates_both_ways,
                                  test_model_folder_page_lists_files_and_times_the_read,
                                  test_quantization_page_measures_outliers_grids_and_bits)
from test_pages import (app, test_attention_page_draws_the_shared_run,  # noqa: F401
                        test_home_links_every_page_and_sidebar_names_the_model,
                        test_journey_generates_streams_and_redraws_without_the_model,
                        test_journey_logit_lens_covers_every_layer,
                        test_journey_measures_the_observer_effect_through_the_scheduler,
                        test_kv_page_shows_the_measured_memory_ledger,
                        test_a_long_runs_maps_are_computed_on_demand_for_every_layer,
                        test_a_run_the_server_dropped_gets_a_message, test_the_context_slider_measures_the_long_text)
from test_notebook_pages import test_journey_and_attention_pages_offer_the_run_in_a_notebook  # noqa: F401
from test_speed_pages import test_precision_page_quantizes_a_copy_and_measures_it  # noqa: F401
from test_speed_pages import test_speed_lab_measures_and_the_curve_grows  # noqa: F401

MAIN = "../app/main.py"


def test_the_app_holds_no_model_and_says_where_it_is(app_env, model_server):
    from app.hosting.model import current_client

    at = AppTest.from_file(MAIN, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    client = current_client()
    assert client.transport == "remote" and not hasattr(client, "lm")
    assert any(model_server in m.value for m in at.sidebar.markdown)


def test_a_request_made_with_the_openai_package_opens_by_link_on_the_attention_page(app_env, model_server):
    """`?run=<id>`: a captured request sent from a script is every page's run, as a browser's would be."""
    import openai

    from conftest import tiny_prompt

    api = openai.OpenAI(base_url=model_server + "/v1", api_key="unused", max_retries=0)
    reply = api.completions.create(model=api.models.list().data[0].id, prompt=tiny_prompt(6), max_tokens=4,
                                   temperature=0, extra_body={"playground": {"capture": True}})
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.query_params["run"] = reply.id
    at.run().switch_page("../pages/attention.py").run()
    assert not at.exception, [e.value for e in at.exception]
    run = at.session_state["last_run"]
    assert run.id == reply.playground["run_id"] and run.text == reply.choices[0].text
    assert run.captures(0) == {} and len(at.get("plotly_chart")) >= 2     # its heatmaps, derived on the server
