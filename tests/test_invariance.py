"""Same question, same numbers (issue 51): with the batch-invariant kernels (engine/core/invariant.py) a request's
logits are bitwise the same (`torch.equal`) alone and in a batch of 2, 7 or 32 with other requests at other
positions, on one thread and on two, with its prompt prefilled whole or in chunks of 64 and 256, and after a prefix
whose K/V another request computed. Without them (plain F.linear and SDPA) they are not: the mutation tests.
Through the scheduler, a request's logits checksum (`DoneRecord.logits_sha256`) is the same alone and in a room of 7
others; through the API (`python -m engine serve`, the `openai` client) `playground.logits_sha256` lets a client
compare two runs."""
from __future__ import annotations

import copy

import openai
import pytest
import torch
from torch.nn import functional as F
from transformers import DynamicCache

from conftest import tiny_prompt, write_tiny_llama
from servers import running_server, tiny_args
from engine.core import invariant, kernels
from engine.core.kernels import attend
from engine.core.generate import GenerationRequest, encode_prompt
from engine.core.hooks import CAPTURE_OFF
from engine.core.lean import LeanStep, causal_mask, lean_step_for
from engine.core.loader import load_model
from engine.core.records import DoneRecord, PrefillRecord
from engine.serving.limits import Limits
from engine.serving.scheduler import Scheduler
from engine.settings import SettingsError

PROMPT = 300                      # tokens: past a 256-token chunk and several key blocks


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A small Llama with SmolLM2's head size (64) and products wide enough for MKL to pick shape-dependent paths."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-invariant"), seed=3, hidden_size=256,
                            intermediate_size=768, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=1024)


@pytest.fixture(scope="module")
def lm(folder):
    return load_model(str(folder), device="cpu", dtype="float32")


@pytest.fixture
def lean(lm):
    step = LeanStep(lm)
    step.invariant = True
    return step


@pytest.fixture
def no_row_kernel():
    """The products in torch's operations (the row kernel off): the path other dtypes and devices take."""
    kernels.use(False)
    yield
    kernels.use(True)


@pytest.fixture
def torch_path():
    """The invariant attention in torch's operations (attend.c off): the path other dtypes and devices take."""
    attend.use(False)
    yield
    attend.use(True)


def ids_of(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def kv_of(cache: DynamicCache):
    """The forward's `kv(layer, k, v)` on one request's cache (as LeanStep.on_cache hands it)."""
    return lambda i, k, v: cache.update(k, v, i)


def prefill(lean: LeanStep, cache: DynamicCache, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Logits [T, V] of every prompt position, the prompt fed in chunks of `chunk` tokens (None: whole)."""
    out, chunk = [], chunk or len(ids)
    with torch.inference_mode():
        for lo in range(0, len(ids), chunk):
            part, start = ids[lo:lo + chunk], cache.get_seq_length()
            positions = torch.arange(start, start + len(part))[None]
            out.append(lean.forward(torch.tensor([part]), positions, kv_of(cache), logits_to_keep=len(part))[0])
    return torch.cat(out)


def decode_batch(lean: LeanStep, caches: list[DynamicCache], tokens: list[int]) -> torch.Tensor:
    """One decode step of several requests as the batch runs it: keys left-padded to the longest, a mask hiding
    the pads. Logits [B, V]."""
    lengths = [c.get_seq_length() for c in caches]
    width = max(lengths) + 1
    valid = torch.tensor([[col >= width - n - 1 for col in range(width)] for n in lengths])

    def kv(i, k, v):                                    # k, v [B, KVH, 1, D]
        rows_k, rows_v = [], []
        for b, c in enumerate(caches):
            keys, values = c.update(k[b:b + 1], v[b:b + 1], i)
            pad = width - keys.shape[2]
            rows_k.append(F.pad(keys, (0, 0, pad, 0)))
            rows_v.append(F.pad(values, (0, 0, pad, 0)))
        return torch.cat(rows_k), torch.cat(rows_v)
    with torch.inference_mode():
        return lean.forward(torch.tensor(tokens)[:, None], torch.tensor(lengths)[:, None], kv,
                            causal_mask(valid, 1))[:, -1]


def decode_alone(lean: LeanStep, cache: DynamicCache, token: int) -> torch.Tensor:
    with torch.inference_mode():
        return lean(token, cache.get_seq_length(), kv_of(cache))


def run_alone(lean: LeanStep, ids: list[int], steps: int, chunk: int | None = None) -> list[torch.Tensor]:
    """The prompt's logits, then each greedy decode step's: the request alone."""
    cache = DynamicCache()
    logits = [prefill(lean, cache, ids, chunk)]
    last = logits[0][-1]
    for _ in range(steps):
        last = decode_alone(lean, cache, int(last.argmax()))
        logits.append(last)
    return logits


def run_in_batch(lean: LeanStep, ids: list[int], steps: int, others: int) -> list[torch.Tensor]:
    """The same request decoding as row `others // 2` of a batch whose other rows are at other positions."""
    vocab, caches, tokens = lean.config.vocab_size, [], []
    me = others // 2
    prompt_logits = None
    for b in range(others + 1):
        cache = DynamicCache()
        logits = prefill(lean, cache, ids if b == me else ids_of(5 + 37 * b % 120, 100 + b, vocab))
        prompt_logits = logits if b == me else prompt_logits
        caches.append(cache)
        tokens.append(int(logits[-1].argmax()))
    out = [prompt_logits]
    for _ in range(steps):
        rows = decode_batch(lean, caches, tokens)
        out.append(rows[me])
        tokens = [int(r.argmax()) for r in rows]
    return out


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"step {step}: differs by {(x - y).abs().max().item():.3g}"


@pytest.mark.parametrize("others", [1, 6, 31])
def test_a_request_gets_the_same_logits_alone_and_in_a_batch(lean, others):
    ids = ids_of(40, 0, lean.config.vocab_size)
    assert_same(run_alone(lean, ids, 4), run_in_batch(lean, ids, 4, others))


@pytest.mark.parametrize("chunk", [64, 256])
def test_a_prompt_prefilled_in_chunks_gives_the_logits_of_a_whole_prefill(lean, chunk):
    ids = ids_of(PROMPT, 1, lean.config.vocab_size)
    assert_same(run_alone(lean, ids, 3), run_alone(lean, ids, 3, chunk))


def test_one_thread_and_two_give_the_same_logits(lean):
    ids, before = ids_of(70, 2, lean.config.vocab_size), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_in_batch(lean, ids, 3, 6)
        torch.set_num_threads(2)
        two = run_in_batch(lean, ids, 3, 6)
    finally:
        torch.set_num_threads(before)
    assert_same(one, two)


def test_a_prefix_from_the_cache_gives_the_logits_of_a_whole_prefill(lean):
    """A second request shares the first's 130-token prefix: its K/V is reused, only the rest is prefilled."""
    vocab = lean.config.vocab_size
    shared, first, second = ids_of(130, 4, vocab), ids_of(20, 5, vocab), ids_of(25, 6, vocab)
    cache = DynamicCache()
    prefill(lean, cache, shared)
    prefill(lean, copy.deepcopy(cache), first)                    # the first request goes on; the prefix cache
    reused = copy.deepcopy(cache)                                 # keeps `cache` as it was after the prefix
    rest = prefill(lean, reused, second)
    whole = prefill(lean, DynamicCache(), shared + second)
    assert torch.equal(rest, whole[len(shared):])


def test_the_invariant_forward_matches_the_usual_one_within_float32_rounding(lm, lean):
    ids = ids_of(80, 7, lm.model.config.vocab_size)
    usual = LeanStep(lm)
    usual.invariant = False
    torch.testing.assert_close(run_alone(lean, ids, 3, 32), run_alone(usual, ids, 3, 32), atol=1e-5, rtol=1e-5)


def test_plain_products_in_the_batch_change_the_numbers(lm, monkeypatch):
    """The mutation: F.linear back in place of the tiled product, and a batched row's logits differ from alone."""
    monkeypatch.setattr(invariant, "linear", F.linear)
    step = LeanStep(lm)
    step.invariant = True
    ids = ids_of(40, 0, lm.model.config.vocab_size)
    alone, batched = run_alone(step, ids, 3), run_in_batch(step, ids, 3, 6)
    assert not all(torch.equal(a, b) for a, b in zip(alone, batched))


def test_every_float32_product_of_the_mode_goes_through_the_row_kernel(lm, monkeypatch):
    """In float32 on the CPU each product of the mode, prefill chunk, decode rows and LM head alike, is the row
    kernel's (one fixed order per output): `linear` up to 8 rows, `tiled` above; none goes to torch's (`padded`)."""
    calls = []
    for name, most in (("linear", kernels.MAX_ROWS), ("tiled", None)):
        def counted(self, x, w, *a, real=getattr(kernels.RowKernel, name), most=most):
            assert most is None or x.shape[0] <= most
            calls.append(x.shape[0])
            return real(self, x, w, *a)
        monkeypatch.setattr(kernels.RowKernel, name, counted)
    monkeypatch.setattr(invariant, "padded", lambda *a: pytest.fail("a product took torch's path"))
    step = LeanStep(lm)
    step.invariant = True
    ids = ids_of(70, 4, lm.model.config.vocab_size)
    run_alone(step, ids, 2, 64)
    run_in_batch(step, ids, 2, 6)
    assert calls.count(64) == 7 * len(step.layers) + 1                  # the first chunk's seven products a layer
    assert {6, 1, 7} <= set(calls)                                      # its second chunk, alone, a batch of 7


def test_the_mode_keeps_the_rooms_packed_panels_and_they_give_its_bits(lm, monkeypatch):
    """The server's room packs the weights in the row kernel's panels (engine.core.small_batch): with the mode on, a
    step of any size keeps those products, q|k|v and gate|up fused, where the forward put its own in before; they go
    through the panels and give every logit the bits the mode's own products give. With the mode off a long chunk
    takes MKL."""
    from engine.core import small_batch
    from engine.serving.lean import LeanDecode

    step, before = LeanStep(lm), lm.small_batch
    step.invariant = True
    lm.small_batch = small_batch.SmallBatchKernels.pack(lm.model, environ={small_batch.ENV: "all"})
    on_panels, used = kernels.RowKernel.on_panels, []
    monkeypatch.setattr(kernels.RowKernel, "on_panels", lambda self, x, *a, **k: used.append(x.shape[0])
                        or on_panels(self, x, *a, **k))
    try:
        decoder = LeanDecode(step)
        assert lm.small_batch.ordered
        for rows in (20, 300):
            linear, fused = decoder.products(rows)
            assert linear == lm.small_batch.ordered_linear and fused is not None
        ids, positions = ids_of(70, 4, lm.model.config.vocab_size), torch.arange(70)[None]
        linear, fused = decoder.products(70)
        with torch.inference_mode():
            kept = step.forward(torch.tensor([ids]), positions, kv_of(DynamicCache()), logits_to_keep=70,
                                linear=linear, fused=fused)
            assert used.count(70) == 4 * len(step.layers) + 1              # q|k|v, o, gate|up, down a layer; the head
            own = step.forward(torch.tensor([ids]), positions, kv_of(DynamicCache()), logits_to_keep=70)
        assert torch.equal(kept, own)
        step.invariant = False
        assert decoder.products(300) == (F.linear, None) and decoder.products(20)[0] == lm.small_batch.linear
    finally:
        lm.small_batch = before


def test_a_library_whose_order_follows_the_row_count_gets_the_tiles(lm, monkeypatch, no_row_kernel):
    """Where the row kernel is not built (or the dtype or device is not its), the products are torch's, padded. The
    one-call product holds only where this library sums a row the same way in any multiple of 8 rows (MKL on the
    machine the kernels were measured on; not a promise). A library that does not (here: a product whose last bit
    moves above 8 rows) fails the probe, and the 8-row tiles keep every row's bits alone and in a batch."""
    class RowCountLibrary:                       # torch.nn.functional, but for its product's last bit above 8 rows
        def __getattr__(self, name):
            return getattr(F, name)

        @staticmethod
        def linear(x, weight, bias=None):
            out = F.linear(x, weight, bias)
            return torch.nextafter(out, torch.full_like(out, float("inf"))) if x.shape[0] > invariant.ROW_TILE else out

    monkeypatch.setattr(invariant, "F", RowCountLibrary())
    monkeypatch.setattr(invariant, "_HOLDS", {})
    step = LeanStep(lm)
    assert not invariant.one_call_holds(step.head[0])
    step.invariant = True
    ids = ids_of(40, 2, lm.model.config.vocab_size)
    assert all(torch.equal(a, b) for a, b in zip(run_alone(step, ids, 3), run_in_batch(step, ids, 3, 12)))   # 13 rows: 16


def test_attention_8_query_rows_a_product_keeps_the_bits_too(lm, monkeypatch, torch_path):
    """Where the probe finds attention's batched products ordered by their row count, 8 query rows go at a time: a
    prompt prefilled whole and in chunks of 64, and a row alone and among 12, still compute the same bits."""
    monkeypatch.setattr(invariant, "blocks_hold", lambda d, dtype, device: False)
    step = LeanStep(lm)
    step.invariant = True
    ids = ids_of(PROMPT, 3, lm.model.config.vocab_size)
    assert all(torch.equal(a, b) for a, b in zip(run_alone(step, ids, 3), run_alone(step, ids, 3, 64)))
    assert all(torch.equal(a, b) for a, b in zip(run_alone(step, ids, 3), run_in_batch(step, ids, 3, 12)))


def random_rows(b: int, t: int, s: int, pads: int = 17):
    """q [b, 4, t, 64], keys/values [b, 2, s, 64] and a mask whose row r has (r * pads) % s left pads."""
    gen = torch.Generator().manual_seed(b * 1000 + t)
    q, k, v = (torch.randn(shape, generator=gen) for shape in ((b, 4, t, 64), (b, 2, s, 64), (b, 2, s, 64)))
    valid = torch.ones(b, s, dtype=torch.bool)
    for r in range(b):
        valid[r, :(r * pads) % s] = False
    return q, k, v, causal_mask(valid, t)


@pytest.mark.parametrize("b, t, s", [(1, 1, 201), (20, 1, 130), (3, 5, 300), (1, 64, 300)])
def test_the_key_blocks_made_at_once_give_the_bits_of_the_walk(monkeypatch, torch_path, b, t, s):
    """A decode step's key blocks in one batched product each (`_blocks_at_once`) against the loop that walks them one
    by one (`_blocks`, the kernel before it): bitwise, with left pads and causal alike."""
    q, k, v, mask = random_rows(b, t, s)
    at_once = [invariant.attention(q, k, v, m, 0.125) for m in (mask, None)]
    monkeypatch.setattr(invariant, "AT_ONCE", -1)                               # every step walks its blocks
    walked = [invariant.attention(q, k, v, m, 0.125) for m in (mask, None)]
    assert all(torch.equal(a, w) for a, w in zip(at_once, walked))


def walked_and_at_once(lm, monkeypatch, ids):
    """The request alone with every attention walking its key blocks (prefill in chunks of 64), and with every one
    made at once (prefilled whole): its logits, step by step."""
    step = LeanStep(lm)
    step.invariant = True
    monkeypatch.setattr(invariant, "AT_ONCE", -1)
    walked = run_alone(step, ids, 3, 64)
    monkeypatch.setattr(invariant, "AT_ONCE", 1 << 40)
    return walked, run_alone(step, ids, 3)


def test_a_decode_step_at_once_gives_the_bits_of_a_walked_prefill_chunk(lm, monkeypatch, torch_path):
    walked, at_once = walked_and_at_once(lm, monkeypatch, ids_of(PROMPT, 5, lm.model.config.vocab_size))
    assert_same(walked, at_once)


def test_a_softmax_over_all_keys_at_once_changes_the_numbers(lm, monkeypatch, torch_path):
    """The mutation: the same attention as one plain softmax over every key (no online rescale block by block), and
    the walked and the at-once runs part: the test above can fail."""
    def plain(q, keys, values, mask, scaling, t):
        b, h, tp, d = q.shape
        scores = torch.matmul(q, keys.transpose(2, 3)) * scaling
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
        return torch.matmul(weights, values)[:, :, :t]
    monkeypatch.setattr(invariant, "_blocks_at_once", plain)
    walked, at_once = walked_and_at_once(lm, monkeypatch, ids_of(PROMPT, 5, lm.model.config.vocab_size))
    assert not all(torch.equal(a, b) for a, b in zip(walked, at_once))


def test_sdpa_in_a_chunked_prefill_changes_the_numbers(lm, monkeypatch):
    """The mutation: SDPA back in place of the fixed key split, and a chunked prompt's logits differ from whole."""
    def sdpa(q, keys, values, mask, scaling):
        if mask is None and q.shape[2] > 1 and keys.shape[2] != q.shape[2]:
            mask = causal_mask(torch.ones(q.shape[0], keys.shape[2], dtype=torch.bool), q.shape[2])
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scaling,
                                              is_causal=mask is None and q.shape[2] > 1, enable_gqa=True)
    monkeypatch.setattr(invariant, "attention", sdpa)
    step = LeanStep(lm)
    step.invariant = True
    ids = ids_of(PROMPT, 1, lm.model.config.vocab_size)
    whole, chunked = run_alone(step, ids, 3), run_alone(step, ids, 3, 64)
    assert not all(torch.equal(a, b) for a, b in zip(whole, chunked))


def test_the_setting_reads_on_and_off_and_is_on_by_default_in_a_hosted_room():
    assert invariant.enabled({}) is False                                       # loopback: one person's machine
    assert invariant.enabled({"PLAYGROUND_HOST": "0.0.0.0"}) is True            # a hosted room
    assert invariant.enabled({invariant.ENV: "on"}) is True
    assert invariant.enabled({invariant.ENV: "off", "PLAYGROUND_HOST": "0.0.0.0"}) is False
    with pytest.raises(SettingsError, match="PLAYGROUND_INVARIANT must be 1 or 0"):
        invariant.enabled({invariant.ENV: "sometimes"})


# --- through the scheduler: the room ----------------------------------------------------------------------------------

def scheduler_with(lm, on: bool):
    """A scheduler of 8 rows whose forward runs the invariant kernels (`on`) or the usual ones."""
    lean_step_for(lm).invariant = on
    return Scheduler(lm, Limits(max_batch=8))


@pytest.fixture
def room(lm):
    made = scheduler_with(lm, True)
    yield made
    made.close()
    lean_step_for(lm).invariant = invariant.enabled()


def done_of(handle) -> DoneRecord:
    records = handle.result(timeout=600)
    assert isinstance(records[-1], DoneRecord), records[-1]
    return records[-1]


def tokens_of(records) -> list[int]:
    return [r.token.id for r in records if hasattr(r, "token")]


def alone_and_in_a_room(scheduler, mine: GenerationRequest):
    """`mine` run alone, then again once 7 others (prompts of other lengths) are decoding beside it: the two runs'
    records, and the most rows any decode step of the second had (8: all of the room)."""
    alone = scheduler.submit(mine).result(timeout=600)
    others = [scheduler.submit(GenerationRequest(tiny_prompt(3 + 5 * i, seed=20 + i), max_new_tokens=40 + 3 * i,
                                                 chat=False)) for i in range(7)]
    for other in others:                                     # each is past its prompt: decoding at its own position
        assert isinstance(other.get(timeout=600), PrefillRecord)
    handle = scheduler.submit(mine)
    in_room = handle.result(timeout=600)
    for other in others:
        done_of(other)
    return alone, in_room, max(len(s.rows) for s in handle.timeline.steps)


def test_a_request_in_a_room_of_seven_has_the_checksum_it_has_alone(room):
    alone, in_room, rows = alone_and_in_a_room(room, GenerationRequest(tiny_prompt(30, seed=5), max_new_tokens=8,
                                                                        chat=False))
    assert rows == 8
    assert alone[-1].logits_sha256 == in_room[-1].logits_sha256
    assert len(alone[-1].logits_sha256) == 64


def test_a_seeded_request_with_temperature_draws_the_same_tokens_in_the_room(room):
    mine = GenerationRequest(tiny_prompt(17, seed=6), max_new_tokens=12, temperature=0.9, seed=12, chat=False)
    alone, in_room, rows = alone_and_in_a_room(room, mine)
    assert rows == 8
    assert tokens_of(alone) == tokens_of(in_room) and len(tokens_of(alone)) == 12
    assert alone[-1].logits_sha256 == in_room[-1].logits_sha256


def test_without_the_mode_the_room_changes_the_checksum(lm):
    """The lesson, and what makes the two tests above able to fail: the usual kernels give a row other bits when
    it shares the step with others."""
    scheduler = scheduler_with(lm, False)
    try:
        alone, in_room, rows = alone_and_in_a_room(scheduler, GenerationRequest(
            tiny_prompt(30, seed=5), max_new_tokens=8, chat=False, logits_sha256=True))     # asked for: mode off
    finally:
        scheduler.close()
        lean_step_for(lm).invariant = invariant.enabled()
    assert rows == 8
    assert alone[-1].logits_sha256 != in_room[-1].logits_sha256


def speculative_and_plain(scheduler, lm, folder) -> tuple[str, str, int]:
    """One greedy request decoded plainly and speculatively (the model itself as its draft: its 4 drafted tokens are
    accepted, and each round's 5 positions come from one verify pass): the two checksums, and the rounds that
    emitted several tokens from one pass."""
    from engine.speculative.decode import draft_from_spec

    mine = GenerationRequest(tiny_prompt(30, seed=5), max_new_tokens=10, chat=False)
    plain = done_of(scheduler.submit(mine))
    records = scheduler.submit(mine, draft=draft_from_spec(str(folder), lm), k=4).result(timeout=600)
    assert isinstance(records[-1], DoneRecord) and records[-1].generated_tokens == 10
    multi = sum(len(r.emitted) > 1 for r in records if hasattr(r, "emitted"))
    return plain.logits_sha256, records[-1].logits_sha256, multi


def test_a_speculative_request_has_the_checksum_of_the_plain_one(room, lm, folder):
    """Speculative decoding verifies several drafted positions in one pass; with the mode on, each emitted token's
    logits row is the one plain decoding computes, so the checksums agree."""
    plain, speculative, multi = speculative_and_plain(room, lm, folder)
    assert len(speculative) == 64 and speculative == plain
    assert multi >= 1                                       # a verify pass did emit several tokens at once


def test_without_the_mode_a_speculative_request_changes_the_checksum(lm, folder):
    scheduler = scheduler_with(lm, False)
    try:
        plain, speculative, multi = speculative_and_plain(scheduler, lm, folder)
    finally:
        scheduler.close()
        lean_step_for(lm).invariant = invariant.enabled()
    assert multi >= 1 and speculative != plain


# --- through the API: the checksum a client compares ------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(folder, tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("serve-invariant"), tiny_args(folder, "--max-batch", "8"),
                        env={invariant.ENV: "on"}) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)


def checksum(client, prompt: str, stream: bool = False) -> str:
    """`playground.logits_sha256` of a greedy completion: from the body, or from a stream's last chunk."""
    args = dict(model=client.models.list().data[0].id, prompt=prompt, max_tokens=6, temperature=0)
    if not stream:
        return client.completions.create(**args).model_extra["playground"]["logits_sha256"]
    chunks = list(client.completions.create(**args, stream=True))
    assert all((c.model_extra.get("playground") or {}).get("logits_sha256") is None for c in chunks[:-1])
    return chunks[-1].model_extra["playground"]["logits_sha256"]


def test_the_api_returns_the_same_checksum_for_the_same_question(client):
    first = checksum(client, tiny_prompt(20, seed=8))
    assert len(first) == 64 and int(first, 16) >= 0
    assert checksum(client, tiny_prompt(20, seed=8)) == first
    assert checksum(client, tiny_prompt(20, seed=8), stream=True) == first


def test_the_checksum_changes_with_the_logits(client):
    assert checksum(client, tiny_prompt(20, seed=8)) != checksum(client, tiny_prompt(20, seed=9))


def test_in_the_mode_a_step_with_newcomers_and_decoding_rows_runs_apart(lm, monkeypatch):
    """The invariant mode's attention kernel stands in for the forward's (engine.core.invariant) and reads no
    segments: its steps never take the flattened mixed step (the room tests above compare such steps' checksums with
    each request's alone)."""
    from engine.serving import batch as batch_module

    mixed = []
    monkeypatch.setattr(batch_module, "mixed_step", lambda *a: mixed.append(1) or pytest.fail("a mixed step ran"))
    lean = lean_step_for(lm)
    lean.invariant = True
    try:
        runner = batch_module.BatchRunner(lm, max_batch=4)
        first, second = [], []
        requests = [GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=6, chat=False) for n in (7, 12)]
        runner.add(batch_module.Slot(requests[0], encode_prompt(lm, requests[0]), CAPTURE_OFF, first.append,
                                     pytest.fail))
        runner.step()
        runner.add(batch_module.Slot(requests[1], encode_prompt(lm, requests[1]), CAPTURE_OFF, second.append,
                                     pytest.fail))
        while not runner.idle:
            runner.step()
    finally:
        lean.invariant = invariant.enabled()
    assert mixed == [] and first[-1].text and second[-1].text


# --- the default: on in a hosted room ---------------------------------------------------------------------------------

def handed(capsys, *argv: str) -> dict[str, str]:
    """The PLAYGROUND_* variables `playground ARGV` hands the processes it starts (its model server among them), as
    its dry run prints them."""
    from app.launch import main                     # the room's launcher: only for these tests

    assert main(["--dry-run", *argv], environ={"PATH": "/usr/bin:/bin"}) == 0
    return dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines()[1:])


def unasked_checksum(folder, log_dir, env: dict[str, str]) -> str | None:
    """`python -m engine serve` on loopback with `env`: a greedy completion's `playground.logits_sha256`, not asked
    for (the server returns it unasked only while its invariant mode is on)."""
    with running_server(log_dir, tiny_args(folder, "--host", "127.0.0.1"), env=env) as (url, _):
        api = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        out = api.completions.create(model=api.models.list().data[0].id, prompt=tiny_prompt(12, seed=3), max_tokens=3,
                                     temperature=0)
    return (out.model_extra.get("playground") or {}).get("logits_sha256")


def test_a_hosted_rooms_model_server_runs_the_invariant_kernels(folder, tmp_path, capsys):
    env = handed(capsys, "--host", "0.0.0.0", "--web-processes", "1", "--model", str(folder))
    assert env[invariant.ENV] == "1"
    checksum = unasked_checksum(folder, tmp_path, {invariant.ENV: env[invariant.ENV]})
    assert checksum is not None and len(checksum) == 64


def test_a_plain_rooms_model_server_runs_the_usual_kernels(folder, tmp_path, capsys):
    env = handed(capsys, "--web-processes", "1", "--model", str(folder))
    assert env[invariant.ENV] == "0"
    assert unasked_checksum(folder, tmp_path, {invariant.ENV: env[invariant.ENV]}) is None
