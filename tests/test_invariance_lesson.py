"""The room page's lesson "Same question, same numbers" (issue 51): engine.lab.invariance answers one prompt alone and
in a batch of 8 with the invariant kernels off and on. Every answer's log-probabilities are checked against an
independent computation, the same tokens through transformers' own modules; with the kernels on the lone and the
batched answers are the same bits, without them they are not. The page runs it on the tiny model (AppTest)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from conftest import write_tiny_llama
from engine.core.lean import lean_step_for
from engine.core.loader import load_model
from engine.errors import InvalidRequestError
from engine.lab import invariance
from engine.lab.invariance import (Answer, answer_alone, answer_in_batch, compare, lesson_ids, others, private_step,
                                   two_orders)
from engine.service.jobs import JOBS

NEW = 6


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A small Llama with SmolLM2's head size and products wide enough for MKL to pick shape-dependent paths."""
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny-lesson"), seed=3, hidden_size=256, intermediate_size=768,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return load_model(str(folder), device="cpu", dtype="float32")


def prompts(lm) -> list[list[int]]:
    """Mine (4 tokens) among the 7 OTHERS (5 to 8): my row is left-padded in the batch's prefill."""
    mine = lesson_ids(lm, "w3 w5 w7 w9")
    rows = others(lm)
    rows.insert(invariance.MINE, mine)
    return rows


def through_modules(lm, ids: list[int], answer: Answer) -> torch.Tensor:
    """The log-probabilities each answer token was chosen from, by transformers' modules in one forward over the
    prompt and the answer: [N, V]."""
    seq = torch.tensor([ids + answer.tokens[:-1]])
    with torch.inference_mode():
        logits = lm.model(input_ids=seq, use_cache=False).logits[0, len(ids) - 1:]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("on", [False, True])
def test_every_answer_is_what_transformers_modules_compute(lm, on):
    step, rows = private_step(lm, on), prompts(lm)
    alone = answer_alone(step, rows[invariance.MINE], NEW)
    batch = answer_in_batch(step, rows, NEW)
    assert len(batch) == 8 and all(len(a.tokens) == NEW for a in batch)
    for ids, answer in [(rows[invariance.MINE], alone), *zip(rows, batch)]:
        reference = through_modules(lm, ids, answer)
        torch.testing.assert_close(answer.logprobs, reference, atol=1e-4, rtol=0)
        assert answer.tokens == reference.argmax(dim=-1).tolist()


def test_with_the_kernels_on_alone_and_in_the_batch_are_the_same_bits(lm):
    ids = prompts(lm)[invariance.MINE]
    on = compare(lm, "float32", True, ids, NEW)
    assert on.rows == 8 and len(on.gaps) == NEW and on.longest <= on.seconds
    assert on.gaps == [0.0] * NEW and on.parted is None and on.alone == on.in_batch
    off = compare(lm, "float32", False, ids, NEW)
    assert max(off.gaps) > 0                               # the lesson: the usual kernels move the numbers


def test_bfloat16_on_a_copy_with_the_kernels_on_is_the_same_bits_too(lm):
    ids = prompts(lm)[invariance.MINE]
    on = compare(lm, "bfloat16", True, ids, NEW)
    assert on.dtype == "bfloat16" and on.gaps == [0.0] * NEW and on.parted is None
    assert lm.dtype == torch.float32 and next(lm.model.parameters()).dtype == torch.float32   # the copy was used


def test_the_room_keeps_its_own_setting(lm):
    shared = lean_step_for(lm)
    before = shared.invariant
    compare(lm, "float32", not before, prompts(lm)[invariance.MINE], 2)
    assert shared.invariant == before


def test_answers_that_part_are_compared_up_to_where_they_part():
    v = torch.zeros(4, 5)
    a = Answer([1, 2, 3, 4], torch.log_softmax(v, -1))
    b = Answer([1, 2, 0, 4], torch.log_softmax(v + torch.arange(5.0) * 0.1, -1))
    assert invariance.parted_at(a, b) == 2
    assert len(invariance.gaps(a, b)) == 3 and invariance.parted_at(a, a) is None


def test_one_sum_in_two_orders(lm):
    s = two_orders(lm, prompts(lm)[invariance.MINE])
    assert s.length == 256 and s.rows == 256 and 0 < s.rows_differ <= s.rows
    layer = lm.model.model.layers[0]
    ids = prompts(lm)[invariance.MINE]
    with torch.inference_mode():
        x = layer.input_layernorm(lm.model.model.embed_tokens(torch.tensor(ids[-1:])))[0]
        terms = (layer.self_attn.q_proj.weight[s.row] * x).numpy()
    total = np.float32(0)
    for t in terms:                                        # one at a time, in float32
        total = np.float32(total + t)
    lanes = [np.float32(0)] * 8
    for i, t in enumerate(terms):
        lanes[i % 8] = np.float32(lanes[i % 8] + t)
    together = np.float32(0)
    for lane in lanes:
        together = np.float32(together + lane)
    assert (s.in_order, s.in_lanes) == (float(total), float(together)) and s.in_order != s.in_lanes
    assert s.exact == math.fsum(float(t) for t in terms)
    assert abs(s.in_order - s.exact) < 1e-4 and abs(s.in_lanes - s.exact) < 1e-4


def test_a_model_outside_the_one_forward_gets_a_sentence(lm, monkeypatch):
    monkeypatch.setattr(lm.model.config, "model_type", "gemma")
    with pytest.raises(InvalidRequestError, match="transformers' own modules"):
        compare(lm, "float32", True, [5, 6, 7], 2)


@pytest.mark.parametrize("params,said", [({"prompt": "", "dtype": "float32", "on": True, "new": 4}, "prompt"),
                                         ({"prompt": "hi", "dtype": "float16", "on": True, "new": 4}, "float32"),
                                         ({"prompt": "hi", "dtype": "float32", "on": "yes", "new": 4}, "true or"),
                                         ({"prompt": "hi", "dtype": "float32", "on": True, "new": 65}, "1 to 64")])
def test_the_job_refuses_bad_parameters_with_a_sentence(lm, params, said):
    params = {**params, "batch": False}
    with pytest.raises(InvalidRequestError, match=said):
        JOBS["invariance.answer"].check(params, lm)


def test_the_room_page_compares_on_the_tiny_model(app_env):
    at = AppTest.from_file("../pages/room.py", default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.text_input(key="room.same.prompt").value
    at.button(key="room.same.go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[-1].value
    assert list(table["setting"]) == ["float32, invariant kernels off", "float32, invariant kernels on",
                                      "bfloat16, invariant kernels off", "bfloat16, invariant kernels on"]
    assert list(table["largest |Δ log p|"])[1::2] == ["0", "0"]
    words = " ".join(m.value for m in at.markdown)
    assert "float32, invariant kernels on**: the same 16 tokens alone and in the batch, every log-probability equal" \
        in words
    assert {m.label for m in at.metric} >= {"Left to right", "In 8 partial sums", "Difference"}
    assert any(c.proto.spec and "largest" in c.proto.spec for c in at.get("plotly_chart"))


def test_a_left_padded_prefill_gives_a_row_the_logits_of_its_prompt_alone(lm):
    """A padded prefill group (the room prefills newcomers together, each row left-padded to the longest): with the
    kernels on, the padded row's logits are its logits alone. Each pad's query reads its own key, so the keys no
    query reads are not the pads; counting those shifted the row's key blocks (found by this lesson on SmolLM2)."""
    words = lambda n, k: " ".join(f"w{(k * i) % 90 + 4}" for i in range(n))  # noqa: E731
    mine, longer = lesson_ids(lm, words(70, 7)), lesson_ids(lm, words(83, 11))
    step = private_step(lm, True)
    alone = answer_alone(step, mine, 2)
    padded = answer_in_batch(step, [longer, mine], 2)[1]
    assert invariance.gaps(alone, padded) == [0.0, 0.0]


def test_an_answer_crosses_the_wire_to_a_remote_page(lm):
    """A page of a web process without the model (`--engine-url`) gets the job's Answer over MessagePack."""
    from engine.service import wire

    sent = invariance.answer(lm, "float32", True, prompts(lm)[invariance.MINE], 2)
    got = wire.decode(wire.encode(sent))
    assert got.tokens == sent.tokens and np.array_equal(got.logprobs, sent.logprobs) and got.seconds == sent.seconds


def test_the_page_names_the_token_where_the_answers_part(lm):
    from app.speed.same_numbers import parting

    part = invariance.Comparison("bfloat16", False, [0.1, 0.2, 0.3], 2, [5, 6, 7, 8], [5, 6, 9, 8], 8, 1.0, 0.6)
    said = parting(lm, part)
    assert "**bfloat16, invariant kernels off**: the answers part at token 3" in said
    assert f"alone the model says “{lm.tokenizer.decode([7, 8])}…”, in the batch “{lm.tokenizer.decode([9, 8])}…”" \
        in said
    close = invariance.Comparison("bfloat16", False, [0.1, 0.5], None, [5, 6], [5, 6], 8, 1.0, 0.6)
    assert "the log-probabilities not (by up to 0.5): no token here was a close enough call" in parting(lm, close)
