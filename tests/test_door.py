"""One door: a request is checked and tokenized once, at the scheduler, on every path down to the model.

The tiny model's real tokenizer sits inside a wrapper that counts the times it turns text into ids; the
app's path (prepare, then Generate) and the engine's (check, then submit; or submit alone) each use it once.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import tiny_prompt
from app.runs.live import new_live_run
from app.runs.request import Sampling, prepare
from app.runs.run import Draft, stream_generation
from engine.core.generate import GenerationRequest, generate
from engine.core.hooks import CapturePolicy, count_hooks
from engine.core.records import DecodeRecord, PrefillRecord
from engine.errors import EngineError, InvalidRequestError
from engine.serving.limits import Limits
from engine.service.service import EngineService
from engine.serving.scheduler import Scheduler, scheduler_for

POLICY = CapturePolicy(layers=(0, 2), logit_lens=3)


class CountingTokenizer:
    """The real tokenizer underneath, counting every call that turns text into token ids."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def encode(self, *args, **kwargs):
        self.calls += 1
        return self.inner.encode(*args, **kwargs)

    def apply_chat_template(self, *args, tokenize: bool = True, **kwargs):
        self.calls += bool(tokenize)
        return self.inner.apply_chat_template(*args, tokenize=tokenize, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def counted(tiny_lm):
    """The tiny model with a counting tokenizer, and its own process-wide scheduler (closed afterwards)."""
    lm = replace(tiny_lm, tokenizer=CountingTokenizer(tiny_lm.tokenizer))
    yield lm
    scheduler_for(lm).close()
    assert count_hooks(tiny_lm.model) == 0


def token_ids(records) -> list[int]:
    return [r.token.id for r in records if isinstance(r, (PrefillRecord, DecodeRecord))]


def test_check_then_submit_tokenizes_once_and_runs_what_the_engine_runs_alone(counted, tiny_lm):
    scheduler = Scheduler(counted, Limits())
    try:
        request = GenerationRequest(tiny_prompt(9), max_new_tokens=6, chat=False)
        checked = scheduler.check(request, POLICY)
        assert counted.tokenizer.calls == 1 and checked.n_prompt == 9
        records = scheduler.submit(checked, session="a").result(timeout=60)
        assert counted.tokenizer.calls == 1                                    # not encoded again
        assert token_ids(records) == token_ids(generate(tiny_lm, request, POLICY))
        scheduler.submit(request, POLICY).result(timeout=60)                   # a bare request: checked at submit
        assert counted.tokenizer.calls == 2
        with pytest.raises(InvalidRequestError, match="checked for another model"):
            Scheduler(counted, Limits()).submit(checked)
    finally:
        scheduler.close()


@pytest.fixture
def served(counted):
    """The counting model behind the in-process service, as the app reaches it (its start-up warm-up tokenized its
    own three requests: the count starts after it)."""
    service = EngineService(counted)
    assert service.scheduler.warmed and counted.tokenizer.calls == 3
    counted.tokenizer.calls = 0
    return service


@pytest.mark.parametrize("speculative", [False, True])
def test_the_app_path_tokenizes_once_from_prompt_box_to_last_token(counted, served, speculative):
    """prepare (the page's check, every rerun) then Generate: the run and, when speculative, its plain baseline
    read the ids the page's check encoded."""
    prepared = prepare(served, tiny_prompt(7), Sampling(max_new_tokens=5), chat=False)
    assert prepared.error is None and len(prepared.ids) == 7 and counted.tokenizer.calls == 1
    draft = Draft("ngram:3", "n-gram lookup (n <= 3)", "ngram") if speculative else None
    run, checked = new_live_run(served, prepared, True, draft, 3)
    assert checked.ids == prepared.ids and checked.policy == run.policy
    stream_generation(served, run, lambda r: None, draft=draft, checked=checked)
    assert run.status == "done" and run.n_prompt == 7 and len(run.tokens) >= 1
    assert (run.speculation.baseline.status == "done") if speculative else run.speculation is None
    assert counted.tokenizer.calls == 1


def test_a_refused_request_gives_the_same_message_at_the_page_and_at_submit(counted, served):
    label = counted.label
    cases = [("   ", 8, "the prompt is empty; type something for the model to continue"),
             (tiny_prompt(300), 8, f"the prompt is 300 tokens; {label} reads at most 256"),
             (tiny_prompt(250), 48, "250 prompt tokens + 48 new tokens exceed the 256-token context; ask for at "
                                    "most 6 new tokens"),
             ("x" * 40000, 8, "the prompt is 40,000 characters; this server reads at most 32,768 (its limit is 2,048 "
                              "tokens, and a token is rarely more than 16 characters). Shorten it"),
             (tiny_prompt(10), 0, "max new tokens must be 1 to 4096")]
    scheduler = scheduler_for(counted)
    for prompt, new, message in cases:
        prepared = prepare(served, prompt, Sampling(max_new_tokens=new), chat=False)
        assert prepared.error == message and prepared.ids == ()
        with pytest.raises(EngineError) as err:
            scheduler.submit(prepared.request)
        assert str(err.value) == message
    assert counted.tokenizer.calls == 2 * 2          # only the two prompts refused after encoding were encoded, once each
