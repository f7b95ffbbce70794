"""Shared fixtures: a tiny Llama whose random weights the tests write themselves, loaded by the real loader."""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

import engine  # noqa: F401 - the package first: test files that put bench/ on sys.path would else find bench/engine.py
from browsers import browser, people, tab_pool  # noqa: F401 - the browser tests' Chromium and its people's tabs

if TYPE_CHECKING:
    from engine.serving.scheduler import Scheduler

# Every AppTest of app/main.py joins the scheduler's room; a test run must not fill it.
os.environ.setdefault("PLAYGROUND_MAX_SESSIONS", "1000")
# Batched decode steps on CPU use packed oneDNN weights for the shapes measured faster (engine/core/small_batch.py);
# the tests pack every linear, so that every batched test runs that kernel whatever this machine measures.
os.environ.setdefault("PLAYGROUND_SMALL_BATCH", "all")
# Every run the tests make is kept on disk (engine/store): in a folder of this test session's, never the user's cache.
os.environ.setdefault("PLAYGROUND_RUNS_DIR", tempfile.mkdtemp(prefix="playground-test-runs-"))
# ... and the old shelf of kept recordings, which a web process converts into the store at start (engine/runs/kept.py).
os.environ.setdefault("PLAYGROUND_SAVED_DIR", tempfile.mkdtemp(prefix="playground-test-saved-"))


def _parse_one_at_a_time() -> None:
    """AppTest gives every script run a ScriptCache of its own (streamlit/testing/v1/local_script_runner.py), so
    sessions run in threads at once (tests/test_app_serving.py) each parse the page with Streamlit's magic,
    `ast.parse`, at the same moment; CPython 3.11 builds Python AST objects with interpreter-wide state that two
    threads can interleave ("SystemError: AST constructor recursion depth mismatch", cpython gh-106905; it failed
    test_sessions_in_threads_each_stream_their_own_answer_through_the_scheduler once in the suite on 2026-11-27).
    The server has one ScriptCache, whose lock already parses one page at a time."""
    import threading

    try:
        from streamlit.runtime.scriptrunner import magic
    except ImportError:      # a lent GPU machine has no streamlit (bench/gpu_session.sh runs the engine's tests only)
        return

    lock, add_magic = threading.Lock(), magic.add_magic

    def one_at_a_time(code: str, script_path: str):
        with lock:
            return add_magic(code, script_path)
    magic.add_magic = one_at_a_time


_parse_one_at_a_time()

# Deprecations that a library logs rather than warns (pyproject's filterwarnings turns the warned ones into errors).
DEPRECATION_LOGGERS = ("transformers", "streamlit.deprecation_util", "torch")


class _Deprecations(logging.Handler):
    """Keeps every logged record that says something is deprecated."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "deprecat" in text.lower():
            self.seen.append(f"{record.name}: {text}")


def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker, the modules longest first (tests/longest_first.py: the parallel part ends sooner);
    a run without workers keeps pytest's order."""
    if not hasattr(config, "workerinput"):
        return
    from longest_first import longest_first, recorded_seconds

    order = longest_first([item.nodeid for item in items], recorded_seconds())
    items[:] = [items[i] for i in order]


@pytest.fixture(autouse=True)
def no_logged_deprecation(request):
    """Fails a test during which transformers, Streamlit or torch logged a deprecation (e.g. transformers'
    `logger.warning_once("... is deprecated ...")`: only the first test that triggers it fails).

    `@pytest.mark.library_deprecation("text")` lets through a message containing "text" that a library logs
    about its own calls (never about ours), with the reason beside the mark."""
    marker = request.node.get_closest_marker("library_deprecation")
    allowed = marker.args if marker else ()
    handler = _Deprecations()
    loggers = [logging.getLogger(name) for name in DEPRECATION_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    seen = [text for text in handler.seen if not any(part in text for part in allowed)]
    assert not seen, "deprecated calls: " + "; ".join(seen)


@pytest.fixture(autouse=True)
def main_module_restored():
    """Streamlit's script runner (AppTest included) installs the page as sys.modules["__main__"] and never puts the
    old one back; a later test that starts a `spawn` process (bench/api_clients.py's pool) then had its child re-run
    that page's file as its main, die on it, and the parent's first send broke its pipe (test_scheduler then
    test_vs_vllm in one process)."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


TINY_CONFIG = dict(
    vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)


def write_tiny_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer over a fixed vocabulary, saved as tokenizer.json (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(vocab_size - 4)]
    vocab = {w: i for i, w in enumerate(words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", pad_token="<pad>")
    tok.save_pretrained(folder)


def write_tiny_llama(folder: Path, seed: int = 0, **overrides) -> Path:
    """Random-weight LlamaForCausalLM saved as safetensors with its tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY_CONFIG, **overrides})
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    write_tiny_tokenizer(folder, config.vocab_size)
    return folder


def tiny_prompt(n: int = 12, seed: int = 0) -> str:
    """A prompt of n known words for the tiny tokenizer (w-words only)."""
    g = torch.Generator().manual_seed(seed)
    return " ".join(f"w{int(i)}" for i in torch.randint(0, 80, (n,), generator=g))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir):
    from engine.core.loader import load_model

    return load_model(str(tiny_model_dir), device="cpu", dtype="float32")


@pytest.fixture
def app_env(tiny_model_dir, monkeypatch) -> Path:
    """The app reads its model from the environment: here the tiny model, on the CPU, in float32."""
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")
    return tiny_model_dir


@pytest.fixture
def open_script(app_env):
    """Opens one page script on its own on the tiny model (AppTest, run once; the navigation lives in app/main.py)
    and fails on an exception."""
    from streamlit.testing.v1 import AppTest

    def open_page(script: str, timeout: float = 120):
        at = AppTest.from_file(f"../pages/{script}", default_timeout=timeout).run()
        assert not at.exception, [e.value for e in at.exception]
        return at
    return open_page


def app_client(model_dir):
    """The app's own client of the tiny model (the one every AppTest session of this process uses), or None before
    a page made it."""
    from app.hosting.model import model_slot

    return model_slot(str(model_dir), "cpu", "float32", None).client


def app_lm(model_dir):
    """The model the app's in-process service loaded (None before a page loaded it)."""
    client = app_client(model_dir)
    return client.lm if client is not None else None


@pytest.fixture(scope="session")
def app_url(tmp_path_factory):
    """The app as `make run` starts it (the launcher's own command: the pages and the OpenAI API over SmolLM2), one
    process for every browser module that uses it (tests/test_browser.py, _class.py, _spec.py): its start, model
    load and kernel measurement cost more than most of their tests."""
    from test_browser import running_app

    with running_app(tmp_path_factory.mktemp("app")) as url:
        yield url


@pytest.fixture(scope="session")
def smol_lm():
    """The embedded SmolLM2-135M-Instruct (slow tests only)."""
    from engine.core.loader import load_model

    return load_model("default", device="cpu")


def assert_same_residual(batched, single, atol=1e-5):
    """Two runs kept the same hidden states at the same positions, equal within `atol` of the largest value
    (float32 rounding: a batched matmul sums in another order than a matmul of one row)."""
    assert (batched is None) == (single is None)
    if single is None:
        return
    assert batched.layers == single.layers and batched.length == single.length
    for i in single.layers:
        want = single.input(i)
        torch.testing.assert_close(batched.input(i), want, atol=atol * max(1.0, float(want.abs().max())), rtol=0)


def ticking_clock():
    """A clock that moves one second each time it is read: a scheduler given it (`Scheduler(..., clock=)`) reaches a
    time limit of N seconds after N readings, whatever the speed of the machine."""
    import itertools

    ticks = itertools.count()
    return lambda: float(next(ticks))


@contextmanager
def worker_held(scheduler: Scheduler):
    """A job holds the scheduler's worker: requests submitted meanwhile wait in the queue, and when the block ends the
    batch takes as many as it has places for, all in its next step."""
    started, go = threading.Event(), threading.Event()

    def hold(progress) -> None:
        started.set()
        go.wait(120)                                    # only a guard against a test that never releases it

    job = scheduler.submit_job(hold, "a test holding the worker")
    try:
        assert started.wait(120), "the holding job never ran"
        yield
    finally:
        go.set()
        job.result(timeout=120)


class Pause:
    """A listener that holds the scheduler's worker at a request's `at`-th record (mid-step, with the model's lock)
    until the test releases it: what the test does meanwhile cannot race the model, however fast the machine."""

    def __init__(self, at: int = 1):
        self.at, self.seen = at, 0
        self.reached, self.go = threading.Event(), threading.Event()

    def __call__(self, handle, record) -> None:
        self.seen += 1
        if self.seen == self.at:
            self.reached.set()
            self.go.wait(120)                          # only a guard against a test that never releases it

    def wait(self) -> None:
        assert self.reached.wait(120), "the request never reached the pause"

    def release(self) -> None:
        self.go.set()

    def __enter__(self) -> "Pause":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
