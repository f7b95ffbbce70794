"""The speculative page over the remote transport: drafts built and runs made by a real model server, the same
expectations as in-process (tests/test_spec_page.py, imported)."""
from __future__ import annotations

from servers import app_env, model_server  # noqa: F401 - the fixtures: the app as a client of a model server
from test_spec_page import (page, test_early_exit_run,  # noqa: F401
                            test_ngram_run_matches_plain_decoding_and_the_formula,
                            test_the_other_pages_draw_a_speculative_run)
