"""A short quiz for a class: questions, each answer explained, every number computed by the engine.

The question bank is plain data built from engine.projection.card, engine.projection, engine.speculative,
engine.lab.fusion, engine.lab.floatbits, engine.lab.quant_detail, engine.projection.economics and engine.projection.serving_sim, so a
question about KV bytes per token shows what `kv_bytes_per_token` says for the model's config, not
a number typed in here. `render_question` draws one question with Streamlit.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.ui.format import card_size, fmt_bytes
from engine.projection.card import kv_bytes_per_token, naive_weight_bytes, weight_bytes
from engine.projection.economics import projected_token_prices
from engine.lab.floatbits import format_range
from engine.lab.fusion import AttentionShape, largest_intermediate_bytes
from engine.projection.cost import IDEAL, decode_flops, gpu_memory_bytes, prefill_flops, project, users_that_fit
from engine.lab.quant_detail import bits_per_weight
from engine.projection.serving_sim import RequestRecord, Targets, goodput
from engine.projection.specs import gpu_preset, model_preset
from engine.speculative.decode import expected_tokens_per_pass

TARGET, BIG, GPU = "llama-3.1-8b", "llama-3.1-70b", "h100-sxm"
ACCEPTANCE, DRAFT_K = 0.8, 4
USERS_CONTEXT, BATCH_CONTEXT, BATCH = 10 * 1024, 1024, 64
LONG_PROMPT, NO_CACHE_CONTEXT, BIG_VALUE = 32 * 1024, 1000, 100_000.0
PRICE_PROMPT = 1024
# (name, seconds to the first token, mean seconds between tokens, output tokens), served in GOODPUT_SECONDS
GOODPUT_TRACE = (("A", 0.2, 0.030, 100), ("B", 0.4, 0.060, 80), ("C", 0.9, 0.020, 50), ("D", 0.3, 0.040, 200),
                 ("E", 0.1, 0.010, 20), ("F", 0.45, 0.070, 120))
GOODPUT_TARGETS, GOODPUT_SECONDS = Targets(ttft=0.5, itl=0.05), 2.0


@dataclass(frozen=True)
class Question:
    key: str
    topic: str
    text: str
    options: tuple[str, ...]
    answer: int                   # index into options
    explanation: str

    @property
    def correct(self) -> str:
        return self.options[self.answer]


def _numeric(key: str, topic: str, text: str, right: float, wrong: list[float], fmt, explanation: str) -> Question:
    """A question whose options are numbers, shown smallest first."""
    values = sorted({right, *wrong})
    return Question(key, topic, text, tuple(fmt(v) for v in values), values.index(right), explanation)


def q_decode_bound() -> Question:
    spec, gpu = model_preset(TARGET), gpu_preset(GPU)
    one = project(spec, gpu, batch=1, context=1024)
    naive = gpu.bandwidth_bytes_s / weight_bytes(spec, "bf16")
    read = project(spec, gpu, batch=1, context=1).weight_bytes_read
    return Question(
        "decode", "Prefill and decode",
        f"Generating an answer with {spec.name} on one {gpu.name}: which phase is limited by memory bandwidth "
        "rather than by arithmetic?",
        ("Prefill (reading the prompt)", "Decode (one new token at a time)", "Both equally", "Neither: the GPU is "
         "always compute-bound"), 1,
        f"Each decode step reads the weights once to produce one token per user: bandwidth / weight bytes = "
        f"{naive:,.0f} tokens/s for all {fmt_bytes(weight_bytes(spec, 'bf16'))}, or {gpu.bandwidth_bytes_s / read:,.0f} "
        f"tokens/s counting only what a step reads ({fmt_bytes(read)}: the embedding table is looked up one row per "
        f"token). A step uses only {one.decode_flops_utilization:.1%} of the GPU's FLOPs. Prefill pushes all prompt "
        "tokens through the same weights in one pass, so it does much more arithmetic per byte and is compute-bound.")


def q_kv_per_token() -> Question:
    spec = model_preset(TARGET)
    right = kv_bytes_per_token(spec, "bf16")
    return _numeric(
        "kv", "KV cache sizing",
        f"{spec.name} has {spec.n_layers} layers, {spec.n_kv_heads} K/V heads of dimension {spec.head_dim}, "
        "and caches in BF16 (2 bytes). How much KV cache does one token take?",
        right, [right / 2, right / spec.n_layers, kv_bytes_per_token(spec.with_full_mha(), "bf16")],
        fmt_bytes,
        f"2 (K and V) x {spec.n_layers} layers x {spec.n_kv_heads} heads x {spec.head_dim} x 2 bytes = "
        f"{right:,.0f} bytes = {fmt_bytes(right)}. Forgetting V halves it; one layer alone is "
        f"{fmt_bytes(right / spec.n_layers)}; with a K/V head per query head it would be 4x more.")


def q_users() -> Question:
    spec, gpu = model_preset(TARGET), gpu_preset(GPU)
    right = users_that_fit(spec, gpu, USERS_CONTEXT)
    ideal = users_that_fit(spec, gpu, USERS_CONTEXT, headroom=IDEAL)
    per_user = kv_bytes_per_token(spec, "bf16") * USERS_CONTEXT
    return _numeric(
        "users", "KV cache sizing",
        f"{spec.name} in BF16 on one {gpu.name} ({card_size(gpu.memory_gb)}), served by an engine that keeps its "
        "default 10% of the card free plus room for its own workspace. Each user keeps 10K tokens in the KV cache. "
        "About how many users fit at once?",
        right, [ideal, users_that_fit(spec.with_full_mha(), gpu, USERS_CONTEXT), users_that_fit(spec, gpu, 1024),
                int(gpu_memory_bytes(gpu) // per_user)], lambda v: f"about {v:,.0f}",
        f"The weights take {fmt_bytes(weight_bytes(spec, 'bf16'))}; the engine fills 90% of the card's "
        f"{fmt_bytes(gpu.memory_bytes)} and keeps the "
        f"CUDA context and an activation workspace out, and the rest holds caches of {fmt_bytes(per_user)} per user "
        f"(10,240 tokens x {fmt_bytes(kv_bytes_per_token(spec, 'bf16'))}), so about {right} users fit. "
        f"Giving the cache all of the card would say {ideal}; forgetting the weights overcounts; at 1K tokens ten "
        "times as many fit; without GQA a quarter.")


def q_gqa() -> Question:
    spec = model_preset(TARGET)
    return Question(
        "gqa", "Grouped-query attention",
        f"{spec.name} has {spec.n_heads} query heads but only {spec.n_kv_heads} key/value heads. What does that buy?",
        (f"{spec.group_size}x fewer attention patterns: query heads in a group attend identically",
         "Nothing at inference time; it only speeds up training",
         f"Each K/V head serves {spec.group_size} query heads, so the KV cache is {spec.group_size}x smaller "
         "than with full multi-head attention",
         f"The model sees {spec.group_size}x more context"), 2,
        f"The cache stores K and V per K/V head, so {spec.n_kv_heads} instead of {spec.n_heads} heads means "
        f"{spec.group_size}x less cache per token. Query heads in a group read the same keys but keep their own "
        "queries, so their attention patterns still differ.")


def q_speculative_rate() -> Question:
    right = expected_tokens_per_pass(ACCEPTANCE, DRAFT_K)
    return _numeric(
        "spec", "Speculative decoding",
        f"A draft proposes k = {DRAFT_K} tokens per round and the target accepts each with probability "
        f"{ACCEPTANCE:.0%}. How many tokens does one target pass yield on average?",
        right, [ACCEPTANCE * DRAFT_K, float(DRAFT_K + 1), 1.0], lambda v: f"{v:.2f}",
        f"Tokens per pass = (1 - a^(k+1)) / (1 - a) = (1 - {ACCEPTANCE}^{DRAFT_K + 1}) / (1 - {ACCEPTANCE}) = "
        f"{right:.2f}: the accepted prefix plus the target's own token. {DRAFT_K + 1} happens only when every "
        "draft is right; 1 is the worst case, no worse than plain decoding.")


def q_speculative_exact() -> Question:
    return Question(
        "spec-exact", "Speculative decoding",
        "At temperature 0, how does the text from speculative decoding compare with plain decoding by the target?",
        ("Close, but the draft's mistakes sometimes slip through", "Identical, token for token",
         "Shorter, because rejected tokens are dropped", "It depends on k"), 1,
        "The target checks every drafted token and keeps only the prefix it would have chosen itself, then adds "
        "its own next token. When sampling, rejection sampling keeps the output distribution exactly the "
        "target's. The draft changes the speed, never the answer.")


def q_quantization() -> Question:
    spec = model_preset(BIG)
    right, naive = weight_bytes(spec, "int4"), naive_weight_bytes(spec, "int4")
    return _numeric(
        "quant", "Quantization",
        f"A real INT4 checkpoint of {spec.name}: 4-bit weights with a 16-bit scale and a 4-bit zero point per group "
        "of 128, the embeddings and the LM head kept in 16-bit. About how large is it?",
        right, [naive, weight_bytes(spec, "int8"), weight_bytes(spec, "bf16")],
        lambda v: f"{v / 1e9:,.0f} GB",
        f"Parameters x half a byte gives {naive / 1e9:.0f} GB, the textbook figure; the scales add about 4%, and the "
        f"embedding table and the LM head ({2 * spec.vocab_size * spec.d_model / 1e9:.1f} B parameters) stay at two "
        f"bytes each, so the file is {right / 1e9:.0f} GB. It fits on one {card_size(gpu_preset(GPU).memory_gb)} "
        "GPU where BF16 needs two. Decode reads "
        "every weight per step, so fewer bytes raise the batch-1 speed ceiling in proportion, at a quality cost of a "
        "few percent.")


def q_batching() -> Question:
    spec, gpu = model_preset(TARGET), gpu_preset(GPU)
    one = project(spec, gpu, batch=1, context=BATCH_CONTEXT)
    many = project(spec, gpu, batch=BATCH, context=BATCH_CONTEXT)
    return _numeric(
        "batch", "Batching",
        f"{spec.name} on one {gpu.name} decodes about {one.total_tok_s:,.0f} tokens/s for one user. With {BATCH} "
        f"users in one batch (1K tokens of context each), about how many tokens/s come out in total?",
        many.total_tok_s, [one.total_tok_s, BATCH * one.total_tok_s, many.per_user_tok_s], lambda v: f"{v:,.0f}",
        f"One step reads the weights once for the whole batch, so throughput grows almost with the batch: "
        f"{many.total_tok_s:,.0f} tokens/s ({many.total_tok_s / one.total_tok_s:.0f}x). Not the full {BATCH}x, "
        f"because every user's KV cache is still read each step; each user now gets {many.per_user_tok_s:,.0f} "
        "tokens/s instead of "
        f"{one.per_user_tok_s:,.0f}.")


def q_attention_scale() -> Question:
    spec = model_preset(TARGET)
    right = spec.head_dim ** -0.5
    return _numeric(
        "scale", "Attention arithmetic",
        f"In {spec.name} each attention head has head_dim = {spec.head_dim}. By what factor are the q·k scores "
        "multiplied before the softmax?",
        right, [1 / spec.head_dim, spec.d_model ** -0.5, 1 / spec.n_heads], lambda v: f"{v:.4f}",
        f"1/√head_dim = 1/√{spec.head_dim} = {right:.4f}. A dot product of two vectors of {spec.head_dim} roughly "
        "unit-sized entries grows like √head_dim; dividing by it keeps the scores in a range where the softmax does "
        f"not saturate. 1/{spec.head_dim} over-shrinks, 1/√d_model uses the wrong width, and the number of heads "
        "plays no part.")


def q_fusion() -> Question:
    spec = model_preset(TARGET)
    shape = AttentionShape.of_spec(spec, LONG_PROMPT, 2)
    right = largest_intermediate_bytes(shape)
    per_head = right / spec.n_heads
    return _numeric(
        "fusion", "FlashAttention",
        f"{spec.name} prefills a {LONG_PROMPT:,}-token prompt with eager (unfused) attention, softmax in float32. "
        "How big is the matrix of attention probabilities of ONE layer?",
        right, [per_head, right / 2, shape.qo_values * 4], lambda v: f"{v / 1e9:,.1f} GB",
        f"{spec.n_heads} heads x {LONG_PROMPT:,} x {LONG_PROMPT:,} scores x 4 bytes = {right / 1e9:,.0f} GB, more "
        f"than an {card_size(gpu_preset(GPU).memory_gb)} card holds. One head alone is {per_head / 1e9:,.1f} GB; Q itself (float32) is only "
        f"{shape.qo_values * 4 / 1e9:,.2f} GB. A fused kernel (FlashAttention) never writes this matrix: it keeps "
        "tiles on chip with a running softmax, so its memory grows with N, not N².")


def q_no_cache() -> Question:
    spec = model_preset(TARGET)
    n = NO_CACHE_CONTEXT
    right = prefill_flops(spec, n) / decode_flops(spec, n)
    return _numeric(
        "nocache", "The KV cache",
        f"Generating with {spec.name}, the sequence is {n:,} tokens long. Without a KV cache the next token must run "
        "the whole sequence again. About how many times the FLOPs of the same step with the cache is that?",
        right, [1.0, float(spec.n_layers), right * n], lambda v: f"about {v:,.0f}x",
        f"With the cache a step pushes one token through the model ({decode_flops(spec, n) / 1e9:,.1f} GFLOPs); "
        f"without it, all {n:,} ({prefill_flops(spec, n) / 1e12:,.1f} TFLOPs): {right:,.0f}x. Summed over an "
        "answer that makes generation O(N²) instead of O(N), which is why every engine keeps the cache.")


def q_bf16_range() -> Question:
    bf16, fp16 = format_range("bf16"), format_range("fp16")
    fits = lambda r: BIG_VALUE <= r.largest                                             # noqa: E731
    options = ("FP16 only", "BF16 only", "Both", "Neither")
    answer = {(True, False): 0, (False, True): 1, (True, True): 2, (False, False): 3}[(fits(fp16), fits(bf16))]
    return Question(
        "bf16", "Number formats",
        f"A residual-stream value reaches {BIG_VALUE:,.0f}. Which 16-bit format can store it without overflowing?",
        options, answer,
        f"BF16 keeps FP32's {bf16.exponent_bits} exponent bits, so its largest value is {bf16.largest:.3g}; FP16 "
        f"has {fp16.exponent_bits} exponent bits and stops at {fp16.largest:,.0f}. FP16 is finer "
        f"({fp16.mantissa_bits} mantissa bits, step {fp16.step_after_one:.4g} after 1.0, against BF16's "
        f"{bf16.mantissa_bits} bits and {bf16.step_after_one:.4g}), but range is what large activations need.")


def q_group_bits() -> Question:
    right = bits_per_weight("rtn-asym-g32")
    return _numeric(
        "groupbits", "Quantization",
        "Weights stored as 4-bit codes with a 16-bit scale and a 16-bit minimum for every group of 32: how many bits "
        "does each weight really take?",
        right, [4.0, bits_per_weight("rtn-sym-g32"), 8.0], lambda v: f"{v:.2f} bits",
        f"4 bits of code + (16 + 16) bits shared by 32 weights = 4 + 1 = {right:.2f} bits. A symmetric grid needs "
        f"no minimum ({bits_per_weight('rtn-sym-g32'):.2f} bits); NF4 with one scale per 64 weights takes "
        f"{bits_per_weight('nf4-b64'):.2f}. This is why real INT4 checkpoints are larger than half a byte per weight.")


def q_output_price() -> Question:
    spec, gpu = model_preset(TARGET), gpu_preset(GPU)
    one, many = projected_token_prices(spec, gpu, (1, BATCH), PRICE_PROMPT)
    right = many.output_per_input
    return _numeric(
        "outprice", "Serving economics",
        f"{spec.name} on one {gpu.name} serves {BATCH} users at once, each with a {PRICE_PROMPT:,}-token prompt. "
        "The GPU costs the same per hour in both phases. About how many input (prompt) tokens cost as much GPU time "
        "as one output token?",
        right, [1.0, one.output_per_input, 1 / right], lambda v: f"{v:,.0f}" if v >= 10 else f"{v:.1f}",
        f"Price follows throughput: prefill reads {BATCH} x {PRICE_PROMPT:,} prompt tokens in one pass "
        f"({many.prefill_tok_s:,.0f} tokens/s, compute-bound), decode gives each user one token per step "
        f"({many.decode_tok_s:,.0f} tokens/s in all, each step reading the weights and all {BATCH} caches), so an "
        f"output token costs {many.prefill_tok_s:,.0f} / {many.decode_tok_s:,.0f} = {right:.1f} input tokens. For "
        f"one user alone it would be {one.output_per_input:,.0f}: batching narrows the gap but does not close it.")


def _goodput_records() -> list[RequestRecord]:
    return [RequestRecord(i, 0.0, 0.0, ttft, ttft + itl * (n - 1), 0, n, n, ttft + itl * (n - 1))
            for i, (_, ttft, itl, n) in enumerate(GOODPUT_TRACE)]


def q_goodput() -> Question:
    t, records = GOODPUT_TARGETS, _goodput_records()
    right = goodput(records, GOODPUT_SECONDS, t).requests_per_s
    ttft_only = goodput(records, GOODPUT_SECONDS, Targets(t.ttft, float("inf"))).requests_per_s
    itl_only = goodput(records, GOODPUT_SECONDS, Targets(float("inf"), t.itl)).requests_per_s
    listed = "; ".join(f"{name}: first token after {ttft:g} s, {itl * 1e3:.0f} ms between tokens"
                       for name, ttft, itl, _ in GOODPUT_TRACE)
    met = [name for (name, *_), r in zip(GOODPUT_TRACE, records) if r.ttft <= t.ttft and r.itl <= t.itl]
    return _numeric(
        "goodput", "Serving economics",
        f"A server finishes these {len(records)} requests in {GOODPUT_SECONDS:g} s. {listed}. The targets: first "
        f"token within {t.ttft:g} s and at most {t.itl * 1e3:.0f} ms between tokens. What is the goodput?",
        right, [len(records) / GOODPUT_SECONDS, ttft_only, itl_only], lambda v: f"{v:g} requests/s",
        f"Goodput counts only the requests that meet both targets: {', '.join(met)}, so {len(met)} in "
        f"{GOODPUT_SECONDS:g} s = {right:g} requests/s. Throughput counts all {len(records)} "
        f"({len(records) / GOODPUT_SECONDS:g}/s); the TTFT target alone would pass {ttft_only * GOODPUT_SECONDS:g} "
        f"and the gap target alone {itl_only * GOODPUT_SECONDS:g}. A server tuned for throughput can serve many "
        "tokens late; goodput is what users were promised.")


def questions() -> list[Question]:
    return [q_decode_bound(), q_kv_per_token(), q_gqa(), q_attention_scale(), q_fusion(), q_no_cache(), q_users(),
            q_batching(), q_output_price(), q_goodput(), q_quantization(), q_group_bits(), q_bf16_range(),
            q_speculative_rate(), q_speculative_exact()]


def score(chosen: dict[str, str | None], bank: list[Question]) -> int:
    return sum(chosen.get(q.key) == q.correct for q in bank)


def render_question(number: int, q: Question, ns: str = "quiz") -> str | None:
    """One question as a radio group; once answered, whether it was right and why. Returns the choice."""
    # drawing only: the questions and their checks are plain data, read by tests without Streamlit
    import streamlit as st

    st.markdown(f"**{number}. {q.topic}**")
    choice = st.radio(q.text, q.options, index=None, key=f"{ns}.{q.key}")
    if choice is None:
        return None
    if choice == q.correct:
        st.success("Right.")
    else:
        st.error(f"Not quite: the answer is {q.correct}.")
    st.caption(q.explanation)
    return choice
