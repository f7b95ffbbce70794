""""Open in a notebook" on the journey, attention and speculative pages: the button is there under a finished run,
and what it downloads is the server's own run (float32 attention) as a run file plus the notebook that opens it,
checked against a fresh engine run of the same request. tests/test_remote_pages.py runs these over HTTP too."""
from __future__ import annotations

import io
import json
import zipfile

from conftest import tiny_prompt
from test_pages import app, assert_clean, generate, open_page  # noqa: F401 - `app`: the fixture
from test_runs import execute, kernel, outputs  # noqa: F401 - `kernel`: the fixture
from test_spec_page import REPEATING, page, run_page  # noqa: F401 - `page`: the fixture
from app.runs.notebook import notebook_zip, run_file_bytes
from app.runs.run import LAST_RUN
from engine.core.generate import generate_captured as engine_generate
from engine.runs import attention_differences, attention_tolerance, loads

LABEL = "Open in a notebook"


def buttons(at) -> list[str]:
    return [e.proto.label for e in at.get("download_button")]


def client():
    from app.hosting.model import current_client

    return current_client()


def test_journey_and_attention_pages_offer_the_run_in_a_notebook(app, tiny_lm):  # noqa: F811
    at = open_page(app, "journey.py")
    assert LABEL not in buttons(at)                                   # nothing generated yet
    generate(at, "journey", tiny_prompt(10, seed=7), 4)
    assert LABEL in buttons(at)
    run = at.session_state[LAST_RUN]
    file = loads(run_file_bytes(run, client(), {"page": "journey"}), "journey.run.zip")
    assert attention_tolerance(file) == 1e-5                         # the server's float32 maps, not the page's fp16
    worst = attention_differences(file, engine_generate(tiny_lm, file.request, file.policy))
    assert len(worst) == 3 * len(file.token_ids) and max(worst.values()) <= 1e-5
    assert [row["layer"] for row in file.logit_lens()] == [0, 1, 2]   # filled in by the model at export

    open_page(at, "attention.py")
    assert LABEL in buttons(at)
    with zipfile.ZipFile(io.BytesIO(notebook_zip(run, client(), "attention", 1, 2))) as z:
        names = sorted(z.namelist())
        notebook = json.loads(z.read(next(n for n in names if n.endswith(".ipynb"))))
    assert [n.rsplit(".", 1)[-1] for n in names] == ["ipynb", "zip"]
    assert "LAYER, HEAD = 1, 2" in "".join(notebook["cells"][1]["source"])


def test_the_speculative_page_offers_its_run_in_a_notebook(page, tiny_lm, kernel, tmp_path, monkeypatch):  # noqa: F811
    at = run_page(page, REPEATING, 2, 8)
    assert_clean(at)
    assert LABEL in buttons(at)
    run = at.session_state[LAST_RUN]
    data = run_file_bytes(run, client())
    file = loads(data, "spec.run.zip")
    assert file.rounds and [t.id for t in file.tokens] == [t.id for t in run.tokens]
    worst = attention_differences(file, engine_generate(tiny_lm, file.request, file.policy))
    assert {where for where, _ in worst} == {"prefill"} and max(worst.values()) <= 1e-5
    nb = execute(data, tmp_path, kernel, "speculative", None, None, monkeypatch)      # the rounds table too
    text, kinds = outputs(nb)
    assert file.story is not None and file.story["timings"]["split"]["others_prefill"] == 0.0   # it ran alone
    assert kinds.count("application/vnd.plotly.v1+json") == 4                      # and its steps' chart (none)
    assert "3 captured maps compared; the largest difference is 0.00e+00" in text    # the prefill pass, 3 layers


def test_a_run_file_opens_on_the_recordings_page_and_a_bad_one_is_one_line(app, tiny_lm):  # noqa: F811
    """The uploader takes run files too; a truncated, tampered, newer, contradicting or oversized one gets one
    st.error line and the run shown before stays."""
    from test_runs import bad_files

    at = open_page(app, "journey.py")
    generate(at, "journey", tiny_prompt(8, seed=21), 3)
    shown = at.session_state[LAST_RUN]
    data = run_file_bytes(shown, client())
    open_page(at, "recordings.py")
    oversized = data + b"\0" * (64 * 2**20)
    for name, bad in [*bad_files(data).items(), ("oversized", oversized)]:
        at.file_uploader(key="recordings.upload").set_value((f"{name}.run.zip", bad, "application/zip")).run()
        assert_clean(at)
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and "\n" not in errors[0] and f"{name}.run.zip" in errors[0], (name, errors)
        assert at.session_state[LAST_RUN] is shown                     # nothing else lost
    at.file_uploader(key="recordings.upload").set_value(("good.run.zip", data, "application/zip")).run()
    assert_clean(at) and not at.error
    opened = at.session_state[LAST_RUN]
    assert opened is not shown and [t.id for t in opened.tokens] == [t.id for t in shown.tokens]
    open_page(at, "attention.py")
    assert LABEL in buttons(at)                                        # and it goes to a notebook again
