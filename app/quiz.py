"""A short quiz for a class: eight questions, each answer explained, every number computed by the engine.

The question bank is plain data built from engine.card, engine.projection and engine.speculative, so a
question about KV bytes per token shows what `kv_bytes_per_token` says for the model's config, not
a number typed in here. `render_question` draws one question with Streamlit.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.format import fmt_bytes
from engine.card import kv_bytes_per_token, naive_weight_bytes, weight_bytes
from engine.projection import IDEAL, gpu_memory_bytes, project, users_that_fit
from engine.specs import gpu_preset, model_preset
from engine.speculative import expected_tokens_per_pass

TARGET, BIG, GPU = "llama-3.1-8b", "llama-3.1-70b", "h100-sxm"
ACCEPTANCE, DRAFT_K = 0.8, 4
USERS_CONTEXT, BATCH_CONTEXT, BATCH = 10 * 1024, 1024, 64


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
        lambda v: fmt_bytes(v, binary=True),
        f"2 (K and V) x {spec.n_layers} layers x {spec.n_kv_heads} heads x {spec.head_dim} x 2 bytes = "
        f"{right:,.0f} bytes = {fmt_bytes(right, binary=True)}. Forgetting V halves it; one layer alone is "
        f"{fmt_bytes(right / spec.n_layers, binary=True)}; with a K/V head per query head it would be 4x more.")


def q_users() -> Question:
    spec, gpu = model_preset(TARGET), gpu_preset(GPU)
    right = users_that_fit(spec, gpu, USERS_CONTEXT)
    ideal = users_that_fit(spec, gpu, USERS_CONTEXT, headroom=IDEAL)
    per_user = kv_bytes_per_token(spec, "bf16") * USERS_CONTEXT
    return _numeric(
        "users", "KV cache sizing",
        f"{spec.name} in BF16 on one {gpu.name} ({gpu.memory_gb:.0f} GB), served by an engine that keeps its default "
        "10% of the card free plus room for its own workspace. Each user keeps 10K tokens in the KV cache. About "
        "how many users fit at once?",
        right, [ideal, users_that_fit(spec.with_full_mha(), gpu, USERS_CONTEXT), users_that_fit(spec, gpu, 1024),
                int(gpu_memory_bytes(gpu) // per_user)], lambda v: f"about {v:,.0f}",
        f"The weights take {fmt_bytes(weight_bytes(spec, 'bf16'))}; the engine fills 90% of the card and keeps the "
        f"CUDA context and an activation workspace out, and the rest holds caches of {fmt_bytes(per_user)} per user "
        f"(10,240 tokens x {fmt_bytes(kv_bytes_per_token(spec, 'bf16'), binary=True)}), so about {right} users fit. "
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
        f"bytes each, so the file is {right / 1e9:.0f} GB. It fits on one 80 GB GPU where BF16 needs two. Decode reads "
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


def questions() -> list[Question]:
    return [q_decode_bound(), q_kv_per_token(), q_gqa(), q_users(), q_batching(), q_quantization(),
            q_speculative_rate(), q_speculative_exact()]


def score(chosen: dict[str, str | None], bank: list[Question]) -> int:
    return sum(chosen.get(q.key) == q.correct for q in bank)


def render_question(number: int, q: Question, ns: str = "quiz") -> str | None:
    """One question as a radio group; once answered, whether it was right and why. Returns the choice."""
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
