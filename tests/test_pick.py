"""A greedy token's pick and description in C (glue.c's pick_row, engine/core/generate.py's `quick_facts`) against
torch's operators (`torch_facts`: softmax, argmax, top-k, the rest's log-sum-exp), on real logits of the tiny model
and on a SmolLM2-sized vocabulary; a row's description alone and among other rows; the rows that take it."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_prompt
from engine.core import generate as G
from engine.core.generate import GenerationRequest, encode_prompt
from engine.core.kernels import glue
from engine.core.lean import lean_step_for

GREEDY = GenerationRequest("x", temperature=0.0)


def vocab_rows(rows: int = 5, vocab: int = 49152, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 4


def same_facts(got: dict, want: dict, ids_exact: bool = True, logits: torch.Tensor | None = None) -> None:
    """got (C) against want (torch): the same ids and logits; probabilities within torch's float32 softmax's own
    error (its sum over 49,152 terms: 8.8e-6 relative here) and, given the logits, within 1e-6 of float64's."""
    assert got.keys() == want.keys()
    assert torch.equal(got["ids"], want["ids"]) and int(got["vocab"]) == int(want["vocab"])
    for key in ("top_ids", "kept_ids"):
        assert torch.equal(got[key], want[key]) if ids_exact else got[key].shape == want[key].shape
    assert torch.equal(got["kept_values"], want["kept_values"])
    assert torch.equal(got["chosen_logits"], want["chosen_logits"])
    for key in ("top_probs", "chosen_probs"):
        torch.testing.assert_close(got[key], want[key], rtol=2e-5, atol=1e-9)
    if logits is not None:
        exact = torch.softmax(logits.double(), -1)
        torch.testing.assert_close(got["top_probs"].double(), exact.gather(-1, got["top_ids"]), rtol=1e-6, atol=1e-12)
        rest = torch.logsumexp(logits.double().scatter(-1, got["kept_ids"], float("-inf")), -1)
        if "rest" in got:
            torch.testing.assert_close(got["rest"].double(), rest, rtol=1e-6, atol=1e-6)
    if "rest" in want:
        torch.testing.assert_close(got["rest"], want["rest"], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("vocab", [96, 257, 300, 49152])
def test_the_c_facts_equal_torchs(vocab):
    logits = vocab_rows(4, vocab)
    same_facts(G.quick_facts(logits), G.torch_facts(logits, [GREEDY] * 4, [None] * 4), logits=logits)


def test_the_c_facts_of_the_tiny_models_real_logits_equal_torchs(tiny_lm):
    lean = lean_step_for(tiny_lm)
    from transformers import DynamicCache
    ids = encode_prompt(tiny_lm, GenerationRequest(tiny_prompt(12), chat=False))
    cache = DynamicCache(config=tiny_lm.model.config)
    with torch.inference_mode():
        logits = lean.forward(torch.tensor([ids]), torch.arange(len(ids))[None], lambda i, k, v: cache.update(k, v, i),
                              logits_to_keep=len(ids))[0]                                      # [T, V]
    same_facts(G.quick_facts(logits), G.torch_facts(logits, [GREEDY] * len(ids), [None] * len(ids)), logits=logits)


def test_equal_logits_rank_the_lower_id_first_as_argmax_picks_it():
    logits = vocab_rows(1, 1000)
    logits[0, 700] = logits[0, 30] = logits.max() + 1             # a tie at the top
    logits[0, 900] = logits[0, 10] = logits[0, 500] = -30.0        # and among the rest
    facts = G.quick_facts(logits)
    assert facts["ids"].tolist() == [30] == G.greedy_ids(logits)
    assert facts["kept_ids"][0, :2].tolist() == [30, 700]
    want = G.torch_facts(logits, [GREEDY], [None])
    same_facts(facts, want, ids_exact=False)                       # torch's top-k ranks the tie its own way


def test_a_tie_at_the_edge_of_the_kept_logits_counts_in_the_rest():
    """The largest logit left out equals kept ones: those kept weigh nothing in the rest, the others count once."""
    logits = torch.full((1, 400), -5.0)
    logits[0, :255] = torch.linspace(10, 0, 255)
    logits[0, 255:260] = -1.0                                      # one kept at -1, four left out at -1
    facts = G.quick_facts(logits)
    want = G.torch_facts(logits, [GREEDY], [None])
    torch.testing.assert_close(facts["rest"], want["rest"], rtol=1e-6, atol=1e-6)


def test_a_rows_description_is_the_same_alone_and_among_other_rows_of_any_kind():
    logits = vocab_rows(6, 5000, seed=3)
    alone = G.quick_facts(logits[2:3])
    requests = [GenerationRequest("x", temperature=0.8, seed=1), GREEDY,
                GREEDY, GenerationRequest("x", top_k=5), GREEDY, GenerationRequest("x", temperature=1.0, top_p=0.9)]
    assert G.quick_rows(logits, requests) == [False, True, True, False, True, False]
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    quick = [b for b in range(6) if G.quick_rows(logits, requests)[b]]
    parts = [(quick, G.quick_facts(logits[quick])),
             ([0, 3, 5], G.torch_facts(logits[[0, 3, 5]], [requests[b] for b in (0, 3, 5)], [gens[b] for b in (0, 3, 5)]))]
    batch = G.merged(parts, 6)
    for key in alone:
        if key != "vocab":
            assert torch.equal(batch[key][2], alone[key][0]), key


def test_off_a_cpu_or_without_glue_the_rows_take_torchs_path():
    logits = vocab_rows(2, 300)
    assert G.quick_rows(logits.double(), [GREEDY] * 2) == [False, False]
    glue.GLUE.use(False)
    try:
        assert G.quick_rows(logits, [GREEDY] * 2) == [False, False]
    finally:
        glue.GLUE.use(True)
    assert G.quick_rows(logits, [GREEDY] * 2) == [True, True]


def test_the_largest_logits_at_either_end_of_the_row_are_found():
    logits = vocab_rows(2, 49152, seed=5)
    logits[0, -1], logits[0, 0] = 100.0, 99.0
    logits[1, -3:] = torch.tensor([50.0, 60.0, 70.0])
    same_facts(G.quick_facts(logits), G.torch_facts(logits, [GREEDY] * 2, [None] * 2), logits=logits)
    assert G.quick_facts(logits)["kept_ids"][:, :3].tolist() == [[49151, 0, logits[0, 1:-1].argmax().item() + 1],
                                                                 [49151, 49150, 49149]]


@pytest.mark.parametrize("kind", ["few values", "minus infinity", "ascending", "descending"])
def test_a_rows_kept_logits_are_its_largest_the_lower_id_first_whatever_its_ties(kind):
    """glue.c reads a long row's blocks of 16 logits for their largest, then only the blocks that can hold one of the
    257 best, and the 3 past the last whole block: on rows of massive ties (5 values over 49,155 logits), a third of
    them -inf, and sorted either way, the kept ids are a stable sort's (largest first, the lower id first among equal
    ones)."""
    g = torch.Generator().manual_seed(11)
    row = torch.randn(1, 49155, generator=g) * 3
    if kind == "few values":
        row = torch.randint(0, 5, (1, 49155), generator=g).float()
    elif kind == "minus infinity":
        row[0, ::3] = float("-inf")
    else:
        row = row.sort(descending=kind == "descending").values
    want = row.sort(descending=True, stable=True)
    got = G.quick_facts(row)
    assert torch.equal(got["kept_ids"], want.indices[:, :G.KEEP_LOGITS])
    assert torch.equal(got["kept_values"], want.values[:, :G.KEEP_LOGITS])


def tokens(lm, logits: torch.Tensor, requests: list[GenerationRequest]) -> list:
    """pick_tokens' SampledTokens for rows of logits [B, V], each row with its own generator and text stream."""
    gens = [torch.Generator().manual_seed(b) for b in range(len(requests))]
    return G.pick_tokens(lm, logits, requests, gens, [G.TextStream(lm.tokenizer) for _ in requests])


def same_token(a, b) -> bool:
    """Two SampledTokens bit for bit (their arrays compared as bytes)."""
    return (a.id, a.text, a.prob, a.top, a.rest_logsumexp, a.rest_count, a.logit) == \
        (b.id, b.text, b.prob, b.top, b.rest_logsumexp, b.rest_count, b.logit) and \
        a.logit_ids.tobytes() == b.logit_ids.tobytes() and a.logits.tobytes() == b.logits.tobytes()


@pytest.mark.parametrize("rows", [2, 5, 17, 32])
def test_a_greedy_rows_token_is_the_same_bits_alone_and_among_2_to_32_rows(tiny_lm, rows):
    """Through pick_tokens: a greedy row among sampled, filtered and greedy rows gives the SampledToken it gives
    alone (the C path whatever the other rows)."""
    vocab = tiny_lm.model.config.vocab_size
    logits = vocab_rows(rows, vocab, seed=rows)
    kinds = [GREEDY, GenerationRequest("x", temperature=0.8, seed=1), GenerationRequest("x", top_k=5),
             GenerationRequest("x", temperature=1.0, top_p=0.9)]
    requests = [kinds[b % len(kinds)] for b in range(rows)]
    batch = tokens(tiny_lm, logits, requests)
    for b in range(0, rows, len(kinds)):
        assert same_token(batch[b], tokens(tiny_lm, logits[b:b + 1], [GREEDY])[0]), b


def test_with_the_c_pick_off_the_same_tokens_come_from_torchs_path(tiny_lm):
    """PICK_IN_C off (bench/lone_parts.py's no-pick way): torch's path, the same ids and kept logits, probabilities
    within torch's float32 softmax's error."""
    logits = vocab_rows(3, tiny_lm.model.config.vocab_size, seed=9)
    quick = tokens(tiny_lm, logits, [GREEDY] * 3)
    G.PICK_IN_C = False
    try:
        assert G.quick_rows(logits, [GREEDY] * 3) == [False] * 3
        slow = tokens(tiny_lm, logits, [GREEDY] * 3)
    finally:
        G.PICK_IN_C = True
    for a, b in zip(quick, slow):
        assert (a.id, a.logit_ids.tolist(), a.logits.tolist()) == (b.id, b.logit_ids.tolist(), b.logits.tolist())
        assert a.prob == pytest.approx(b.prob, rel=2e-5)


def test_past_the_kept_logits_a_greedy_rows_token_is_the_same_bits_alone_and_in_a_batch(tmp_path):
    """A vocabulary wider than the kept logits (600 > 256: the rest's log-sum-exp and count are described too):
    a greedy row alone (`quick_tokens`, straight from numpy) and among sampled and filtered rows (`quick_facts`
    merged with torch's rows) gives the same SampledToken, bit for bit."""
    from types import SimpleNamespace
    from transformers import AutoTokenizer
    from conftest import write_tiny_tokenizer
    write_tiny_tokenizer(tmp_path, 600)
    lm = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(tmp_path))     # what pick_tokens reads of a model
    logits = vocab_rows(5, 600, seed=21)
    requests = [GREEDY, GenerationRequest("x", temperature=0.8, seed=1), GREEDY, GenerationRequest("x", top_k=5),
                GREEDY]
    batch = tokens(lm, logits, requests)
    for b in (0, 2, 4):
        alone = tokens(lm, logits[b:b + 1], [GREEDY])[0]
        assert alone.rest_count == 600 - G.KEEP_LOGITS and alone.rest_logsumexp is not None
        assert same_token(batch[b], alone), b
