"""The projected plane: what a model would cost on GPUs, from its config and the spec sheet alone.

Pure arithmetic, no torch. Every figure is a closed-form estimate a page can show next to its
formula. Conventions (docs/projection.md explains them and their sources):

- "1K" tokens = 1024, so "128K" is Llama 3.1's 131,072-token context.
- Sizes (engine/projection/units.py): decimal GB everywhere, as the FACTS table uses them (8.03 B x 2 = 16.06 GB). The
  one binary figure is a card's memory: the spec sheet's "80 GB" of HBM is 80 GiB = 85.90 GB (nvidia-smi
  shows an H100 80GB as 81,559 MiB).
- Memory headroom: a serving engine fills only `utilization` of each card (vLLM's default 0.9) and
  keeps the CUDA context and an activation workspace out of the KV cache. `IDEAL` gives weights and
  KV the whole card (the seed's table); `REALISTIC` is the default.
- A forward pass costs 2 FLOPs per weight it multiplies through (the embedding lookup is a read, not
  a matmul; prefill runs the LM head on each prompt's last position only), plus causal attention.
- A step moves the weights it needs (an untied embedding table: only the rows of its tokens; an MoE
  layer: only the experts its tokens picked) plus the KV cache it reads or writes; its time is
  max(bytes / (bandwidth x bw_eff), FLOPs / (peak x flops_eff)) plus the GPUs' communication.
- TTFT = queueing + prefill (as vLLM and DistServe measure it): the prefill pass yields the first
  token. A projected batch arrives together, so nobody queues. Each further token costs one decode step.
- Tensor parallelism splits every layer over GPUs of one node (two all-reduces per layer); pipeline
  parallelism runs consecutive layers on further GPUs (one hand-off per stage); replicas multiply users.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from engine.projection.card import (active_param_counts, cached_layer_tokens, expert_bytes,
                                    kv_bytes_per_token, kv_bytes_per_user, lm_head_params, matmul_params_per_token,
                                    param_counts, weight_bytes)
from engine.projection.specs import GPUSpec, ModelSpec, dtype_bytes
from engine.projection.units import GIB, fmt_bytes

TOKENS_PER_K = 1024            # "1K tokens"
# The one efficiency default of the projected plane: every page and the CLI project with these unless a person
# moves a slider (docs/projection.md, "Efficiency"). Real engines decode Llama 3.1 8B at ~150 tok/s on an
# H100 SXM; a step there reads 15.1 GB (the weights less the embedding table, plus 1K tokens of KV), so they
# reach 150 x 15.1 GB = 2.3 TB/s of the 3.35 TB/s peak, 0.68; the best copy kernel reaches ~3.0 TB/s (0.9).
DEFAULT_BANDWIDTH_EFFICIENCY = 0.7  # share of peak bandwidth a decode step reaches: 8B on an H100 -> 155 tok/s
DEFAULT_FLOPS_EFFICIENCY = 0.6      # share of peak tensor FLOP/s a large prefill reaches
DEFAULT_DOLLARS_PER_HOUR = 3.0      # rental price of one GPU
DEFAULT_UTILIZATION = 0.9           # vLLM's default gpu_memory_utilization
CUDA_CONTEXT_BYTES = 0.5 * GIB      # CUDA context, cuBLAS and NCCL handles: about half a GiB (0.54 GB) per GPU
PROFILE_TOKENS = 8192               # tokens in vLLM's start-up profiling pass (max_num_batched_tokens)
PROFILE_SEQS = 256                  # sequences whose FP32 logits it samples (max_num_seqs)
GPUS_PER_NODE = 8
INTERNODE_GBS = 50.0                # one 400 Gb/s InfiniBand NDR port per GPU (DGX H100/H200/B200)
COLLECTIVE_LATENCY_S = 10e-6        # fixed cost of one all-reduce or stage hand-off (an assumption)
ACTIVATION_BYTES = 2                # activations travel between GPUs in 16-bit
WEIGHT_ORDER = ("fp32", "bf16", "fp8", "int4")


def gpu_memory_bytes(gpu: GPUSpec, memory_fraction: float = 1.0) -> float:
    """GPU memory in bytes: spec-sheet GB read as GiB, times the share we may fill."""
    return gpu.memory_bytes * memory_fraction


def compute_precision(weight_dtype: str) -> str:
    """The precision the matmuls run in: 8-bit weights use 8-bit tensor cores; 4-bit weights are
    dequantized to BF16 (weight-only quantization); FP32 runs as TF32."""
    size = dtype_bytes(weight_dtype)
    if size >= 4:
        return "fp32"
    return "fp8" if size == 1 else "bf16"


def peak_flops(gpu: GPUSpec, weight_dtype: str = "bf16") -> float:
    """Peak dense FLOP/s for matmuls with these weights (TF32 = half the BF16 rate)."""
    precision = compute_precision(weight_dtype)
    if precision == "fp32":
        return gpu.bf16_tflops * 1e12 / 2
    return gpu.peak_flops(precision)


def linear_flops_per_token(spec: ModelSpec) -> float:
    """2 FLOPs (multiply + add) per weight a decode token is multiplied through: every active
    parameter but the embedding lookup and the norms, LM head included (~15.0 GFLOPs for Llama 3.1 8B,
    the ~2N = 16 GFLOPs rule of thumb less the embedding table)."""
    return 2.0 * matmul_params_per_token(spec)


def attention_flops_per_pair(spec: ModelSpec) -> float:
    """FLOPs for one (query, key) pair over all layers and heads: q.k (2 x head_dim) + p.v (2 x value dim)."""
    return 2.0 * spec.n_layers * spec.n_heads * (spec.head_dim + spec.value_dim)


def decode_attention_flops_per_pair(spec: ModelSpec) -> float:
    """Decode with MLA attends in the latent space (the "absorbed" form serving engines use): q.k over
    latent + RoPE dims, p.v over the latent. Other attention: as in prefill."""
    if not spec.is_mla:
        return attention_flops_per_pair(spec)
    return 2.0 * spec.n_layers * spec.n_heads * (2 * spec.kv_lora_rank + spec.qk_rope_head_dim)


def causal_pairs(n: int, window: int = 0) -> float:
    """(query, key) pairs a causal pass over n tokens scores in one layer; a window caps each row."""
    if not window or n <= window:
        return n * (n + 1) / 2
    return window * (window + 1) / 2 + (n - window) * window


def prefill_flops(spec: ModelSpec, tokens: int) -> float:
    """One prompt of `tokens`: the linear part grows with N (LM head on the last position only),
    causal attention with N(N+1)/2 pairs per full layer."""
    head = 2.0 * lm_head_params(spec)
    share = spec.windowed_layers / spec.n_layers
    pairs = (1 - share) * causal_pairs(tokens) + share * causal_pairs(tokens, spec.window)
    return tokens * (linear_flops_per_token(spec) - head) + head + pairs * attention_flops_per_pair(spec)


def decode_flops(spec: ModelSpec, context: int) -> float:
    """One new token attending to `context` cached positions."""
    return linear_flops_per_token(spec) + cached_layer_tokens(spec, context) / spec.n_layers \
        * decode_attention_flops_per_pair(spec)


# --- where the model runs: parallel layout and memory headroom -------------------------------------------

@dataclass(frozen=True)
class Layout:
    """GPUs serving the model: `tensor` x `pipeline` per replica, `replicas` independent copies."""

    tensor: int = 1      # GPUs splitting every layer, inside one node
    pipeline: int = 1    # stages of consecutive layers, each on its own `tensor` GPUs
    replicas: int = 1    # data-parallel copies, each serving its own users

    @property
    def per_replica(self) -> int:
        return self.tensor * self.pipeline

    @property
    def gpus(self) -> int:
        return self.per_replica * self.replicas

    def describe(self) -> str:
        parts = [f"tensor parallel {self.tensor}"] if self.tensor > 1 else []
        parts += [f"pipeline {self.pipeline}"] if self.pipeline > 1 else []
        return f"{self.per_replica} GPU{'s' if self.per_replica > 1 else ''}" + (f" ({' × '.join(parts)})" if parts else "")

    def check(self, spec: ModelSpec) -> None:
        if self.tensor not in (1, 2, 4, 8):
            raise ValueError("tensor parallelism runs over 1, 2, 4 or 8 GPUs of one node")
        if not 1 <= self.pipeline <= spec.n_layers:
            raise ValueError(f"pipeline stages must be between 1 and the model's {spec.n_layers} layers")
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")


GPU_COUNTS = (1, 2, 4, 8, 16, 24, 32, 64)


def standard_layout(gpus: int, replicas: int = 1) -> Layout:
    """`gpus` per replica the usual way: tensor parallel inside a node of 8, then 8-GPU pipeline stages."""
    if gpus <= GPUS_PER_NODE:
        return Layout(gpus, 1, replicas)
    if gpus % GPUS_PER_NODE:
        raise ValueError(f"beyond one node, GPUs per replica come in whole nodes of {GPUS_PER_NODE}")
    return Layout(GPUS_PER_NODE, gpus // GPUS_PER_NODE, replicas)


@dataclass(frozen=True)
class Headroom:
    """What a serving engine leaves out of weights + KV cache on each GPU."""

    utilization: float = DEFAULT_UTILIZATION   # share of the card the engine may fill
    reserve: bool = True                       # keep the CUDA context and an activation workspace out


IDEAL = Headroom(1.0, False)      # the seed's table: all of the card for weights and cache
REALISTIC = Headroom()


def activation_workspace_bytes(spec: ModelSpec, tensor: int = 1) -> float:
    """Peak activations of a profiling pass of PROFILE_TOKENS tokens through the widest MLP in 16-bit
    (its input, the gate and up outputs and their product), plus FP32 logits for PROFILE_SEQS sequences;
    tensor parallelism splits the MLP width and the vocabulary."""
    dense = spec.intermediate_size if spec.dense_layers else 0
    moe = spec.experts_per_token * spec.expert_intermediate_size + spec.shared_intermediate_size
    width = max(dense, moe if spec.is_moe else 0)
    return PROFILE_TOKENS * ACTIVATION_BYTES * (spec.d_model + 3 * width / tensor) \
        + PROFILE_SEQS * spec.vocab_size / tensor * 4


def kv_split(spec: ModelSpec, tensor: int) -> int:
    """GPUs that share out one token's KV: tensor parallelism splits KV heads (at most one GPU per
    head); the MLA latent is shared by all heads, so every tensor-parallel GPU keeps a full copy."""
    return 1 if spec.is_mla else min(tensor, spec.n_kv_heads)


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU of a replica: what it may fill and what it must hold, in bytes."""

    card: float           # the GPU's memory
    usable: float         # what weights + KV may take: card x utilization - reserve
    reserve: float        # CUDA context + activation workspace (0 in the ideal case)
    weights: float        # this GPU's share of the weights
    kv_per_user: float    # this GPU's share of one user's cache
    batch: int

    @property
    def kv(self) -> float:
        return self.batch * self.kv_per_user

    @property
    def needed(self) -> float:
        return self.weights + self.kv

    @property
    def fits(self) -> bool:
        return self.needed <= self.usable

    def users(self) -> int:
        """Users whose cache fits beside the weights."""
        free = self.usable - self.weights
        return max(0, math.floor(free / self.kv_per_user)) if self.kv_per_user > 0 and free > 0 else 0


def memory_plan(spec: ModelSpec, gpu: GPUSpec, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                batch: int = 1, context: int = 1024, layout: Layout = Layout(),
                headroom: Headroom = REALISTIC) -> MemoryPlan:
    reserve = CUDA_CONTEXT_BYTES + activation_workspace_bytes(spec, layout.tensor) if headroom.reserve else 0.0
    card = gpu_memory_bytes(gpu)
    return MemoryPlan(
        card=card, usable=card * headroom.utilization - reserve, reserve=reserve,
        weights=weight_bytes(spec, weight_dtype) / layout.per_replica,
        kv_per_user=kv_bytes_per_user(spec, context, kv_dtype) / layout.pipeline / kv_split(spec, layout.tensor),
        batch=batch)


def users_that_fit(spec: ModelSpec, gpu: GPUSpec, context: int, weight_dtype: str = "bf16",
                   kv_dtype: str = "bf16", headroom: Headroom = REALISTIC, layout: Layout = Layout()) -> int:
    """How many users, each holding `context` cached tokens, one replica holds beside its weights."""
    return memory_plan(spec, gpu, weight_dtype, kv_dtype, 1, context, layout, headroom).users()


@dataclass(frozen=True)
class UsersRow:
    """One row of the KV-cache page's table."""

    context: int            # tokens per user
    kv_bytes_per_user: float
    users: int              # users that fit beside the weights, with a server's headroom
    users_ideal: int        # the same with all of the card for weights + KV

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def users_table(spec: ModelSpec, gpu: GPUSpec, kv_dtype: str = "bf16", weight_dtype: str = "bf16",
                contexts: Sequence[int] = (1024, 10240, 102400, 131072), layout: Layout = Layout()) -> list[UsersRow]:
    """Rows (context, cache per user, users realistic and ideal) for each context length."""
    return [UsersRow(c, kv_bytes_per_user(spec, c, kv_dtype),
                     users_that_fit(spec, gpu, c, weight_dtype, kv_dtype, REALISTIC, layout),
                     users_that_fit(spec, gpu, c, weight_dtype, kv_dtype, IDEAL, layout)) for c in contexts]


# --- time: the cost model --------------------------------------------------------------------------------

@dataclass(frozen=True)
class CostModel:
    """Per-step time model shared by the projection and the serving simulation.

    Bytes and FLOPs are those of a whole replica; `peak_flops` and `bandwidth` are its GPUs' summed
    peaks over the tensor-parallel group (pipeline stages take turns, so they do not add up). The
    defaults after `bandwidth_efficiency` describe a dense model on one GPU.
    """

    weight_bytes: float
    kv_bytes_per_token: float
    linear_flops_per_token: float
    attention_flops_per_pair: float
    peak_flops: float           # FLOP/s
    bandwidth: float            # bytes/s
    flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    embedding_bytes: float = 0.0        # an untied embedding table, of which a step reads its tokens' rows
    embedding_row_bytes: float = 0.0
    expert_bytes: float = 0.0           # one routed expert of one MoE layer
    moe_layers: int = 0
    n_experts: int = 0
    experts_per_token: int = 0
    lm_head_flops: float = 0.0          # per token, inside linear_flops_per_token; prefill runs it once per prompt
    decode_attention_flops_per_pair: float | None = None   # None: as attention_flops_per_pair
    window: int = 0
    window_share: float = 0.0           # share of layers attending to `window` tokens (caching window - 1)
    kv_read_factor: float = 1.0         # tensor-parallel GPUs that each read a full copy of the KV (MLA)
    comm_fixed_seconds: float = 0.0     # per pass: collective latencies
    comm_seconds_per_token: float = 0.0  # per token in the pass: activations over the links

    def memory_seconds(self, nbytes: float) -> float:
        return nbytes / (self.bandwidth * self.bandwidth_efficiency)

    def compute_seconds(self, flops: float) -> float:
        return flops / (self.peak_flops * self.flops_efficiency)

    def comm_seconds(self, tokens: int) -> float:
        return self.comm_fixed_seconds + tokens * self.comm_seconds_per_token

    def experts_touched(self, tokens: int) -> float:
        """Distinct routed experts per MoE layer `tokens` tokens pick (balanced routing)."""
        if not self.n_experts:
            return 0.0
        return self.n_experts * (1 - (1 - self.experts_per_token / self.n_experts) ** max(tokens, 0))

    def weights_read(self, tokens: int) -> float:
        """Weights a pass over `tokens` new tokens reads: all but the embedding rows it does not look up
        and the routed experts no token picked."""
        untouched = self.moe_layers * (self.n_experts - self.experts_touched(tokens)) * self.expert_bytes
        rows = min(tokens * self.embedding_row_bytes, self.embedding_bytes)
        return self.weight_bytes - self.embedding_bytes + rows - untouched

    def effective_tokens(self, context: int) -> float:
        """Cached tokens a layer holds on average at `context`: windowed layers stop at their window."""
        if not self.window_share:
            return float(context)
        return (1 - self.window_share) * context + self.window_share * min(context, self.window - 1)

    def decode_bytes(self, kv_tokens: float, batch: int = 1) -> float:
        """The weights the batch needs plus every cached K/V value it reads."""
        return self.weights_read(batch) + kv_tokens * self.kv_bytes_per_token * self.kv_read_factor

    def decode_step_flops(self, batch: int, kv_tokens: float) -> float:
        """`batch` new tokens; `kv_tokens` = cached positions summed over the batch."""
        per_pair = self.decode_attention_flops_per_pair or self.attention_flops_per_pair
        return batch * self.linear_flops_per_token + kv_tokens * per_pair

    def decode_seconds(self, batch: int, kv_tokens: float) -> float:
        """One decode step: bandwidth-bound until the batch is large enough to be compute-bound, plus
        the communication between GPUs."""
        return max(self.memory_seconds(self.decode_bytes(kv_tokens, batch)),
                   self.compute_seconds(self.decode_step_flops(batch, kv_tokens))) + self.comm_seconds(batch)

    def decode_seconds_at(self, batch: int, context: int) -> float:
        """One decode step with every user holding `context` tokens."""
        return self.decode_seconds(batch, batch * self.effective_tokens(context))

    def prefill_step_flops(self, prompts: Sequence[int]) -> float:
        pairs = sum((1 - self.window_share) * causal_pairs(n) + self.window_share * causal_pairs(n, self.window)
                    for n in prompts)
        head = self.lm_head_flops
        return sum(prompts) * (self.linear_flops_per_token - head) + len(prompts) * head \
            + pairs * self.attention_flops_per_pair

    def prefill_bytes(self, prompts: Sequence[int]) -> float:
        """Weights read once for all the prompts, and their K/V written once."""
        written = sum(self.effective_tokens(n) for n in prompts)
        return self.weights_read(sum(prompts)) + written * self.kv_bytes_per_token * self.kv_read_factor

    def prefill_seconds(self, prompts: Sequence[int]) -> float:
        """Prefill several prompts in one pass."""
        return max(self.memory_seconds(self.prefill_bytes(prompts)),
                   self.compute_seconds(self.prefill_step_flops(prompts))) + self.comm_seconds(sum(prompts))

    def chunk_pairs(self, new: int, past: int) -> float:
        """(query, key) pairs per layer of `new` prompt tokens after `past` tokens of the same prompt already
        cached: the causal pairs of the whole prefix less those of the part done before."""
        def pairs(n: int) -> float:
            return (1 - self.window_share) * causal_pairs(n) + self.window_share * causal_pairs(n, self.window)
        return pairs(past + new) - pairs(past)

    def mixed_step_seconds(self, batch: int, kv_tokens: float, chunks: Sequence[tuple[int, int, bool]] = ()) -> float:
        """One forward pass holding `batch` decode tokens (reading `kv_tokens` cached positions in all) and
        prompt chunks, each (new tokens, tokens of that prompt already cached, whether it ends the prompt):
        chunked prefill. The weights are read once for every token of the pass; a chunk reads its prompt's
        cached K/V and writes its own; the LM head runs on the last position of a prompt only. With no chunks
        this is `decode_seconds`; with one whole prompt and no decodes, `prefill_seconds`."""
        new = sum(n for n, _, _ in chunks)
        kv_moved = kv_tokens + sum(self.effective_tokens(p + n) for n, p, _ in chunks)   # read past, write new
        nbytes = self.weights_read(batch + new) + kv_moved * self.kv_bytes_per_token * self.kv_read_factor
        head = self.lm_head_flops
        flops = self.decode_step_flops(batch, kv_tokens) + sum(
            n * (self.linear_flops_per_token - head) + (head if last else 0.0)
            + self.chunk_pairs(n, p) * self.attention_flops_per_pair for n, p, last in chunks)
        return max(self.memory_seconds(nbytes), self.compute_seconds(flops)) + self.comm_seconds(batch + new)

    def ideal(self) -> "CostModel":
        """The same hardware at 100% of its peaks: the ceiling."""
        return replace(self, flops_efficiency=1.0, bandwidth_efficiency=1.0)


def allreduce_seconds(nbytes: float, gpus: int, link_gbs: float) -> tuple[float, float]:
    """(fixed, per-byte) seconds of a ring all-reduce: each GPU sends 2(g-1)/g of the message one way
    while receiving as much; the spec sheet's link figure counts both directions, so half goes each way."""
    if gpus <= 1:
        return 0.0, 0.0
    return COLLECTIVE_LATENCY_S, 2 * (gpus - 1) / gpus / (link_gbs * 1e9 / 2)


def communication(spec: ModelSpec, gpu: GPUSpec, layout: Layout) -> tuple[float, float]:
    """(fixed seconds per pass, seconds per token) for one replica: tensor parallelism all-reduces the
    activations twice per layer (after attention, after the MLP); pipeline parallelism hands them from
    each stage to the next, over NVLink inside a node and InfiniBand across nodes."""
    row = spec.d_model * ACTIVATION_BYTES                      # one token's activations
    fixed, per_byte = allreduce_seconds(row, layout.tensor, gpu.interconnect_gbs)
    fixed, per_token = 2 * spec.n_layers * fixed, 2 * spec.n_layers * per_byte * row
    if layout.pipeline > 1:
        link = gpu.interconnect_gbs / 2 if layout.per_replica <= GPUS_PER_NODE else INTERNODE_GBS
        fixed += (layout.pipeline - 1) * COLLECTIVE_LATENCY_S
        per_token += (layout.pipeline - 1) * row / (link * 1e9)
    return fixed, per_token


def _embedding_bytes(spec: ModelSpec, weight_dtype: str) -> tuple[float, float]:
    """(untied table, one row) in the bytes a checkpoint keeps them (16-bit when the rest is quantized)."""
    width = max(dtype_bytes(weight_dtype), 2.0)
    row = spec.d_model * width
    return (0.0 if spec.tie_embeddings else spec.vocab_size * row), row


def cost_model(spec: ModelSpec, gpu: GPUSpec, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
               flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY,
               bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY, layout: Layout = Layout()) -> CostModel:
    if not (0 < flops_efficiency <= 1 and 0 < bandwidth_efficiency <= 1):
        raise ValueError("efficiencies must be in (0, 1]")
    layout.check(spec)
    table, row = _embedding_bytes(spec, weight_dtype)
    fixed, per_token = communication(spec, gpu, layout)
    return CostModel(
        weight_bytes=weight_bytes(spec, weight_dtype), kv_bytes_per_token=kv_bytes_per_token(spec, kv_dtype),
        linear_flops_per_token=linear_flops_per_token(spec), attention_flops_per_pair=attention_flops_per_pair(spec),
        peak_flops=peak_flops(gpu, weight_dtype) * layout.tensor, bandwidth=gpu.bandwidth_bytes_s * layout.tensor,
        flops_efficiency=flops_efficiency, bandwidth_efficiency=bandwidth_efficiency,
        embedding_bytes=table, embedding_row_bytes=row, expert_bytes=expert_bytes(spec, weight_dtype),
        moe_layers=spec.moe_layers, n_experts=spec.n_experts if spec.is_moe else 0,
        experts_per_token=spec.experts_per_token, lm_head_flops=2.0 * lm_head_params(spec),
        decode_attention_flops_per_pair=decode_attention_flops_per_pair(spec), window=spec.window,
        window_share=spec.windowed_layers / spec.n_layers, kv_read_factor=layout.tensor / kv_split(spec, layout.tensor),
        comm_fixed_seconds=fixed, comm_seconds_per_token=per_token)


# --- does it fit, and if not, what would ---------------------------------------------------------------

def _gb(nbytes: float) -> str:
    return fmt_bytes(nbytes, 1)


def fit_problems(spec: ModelSpec, gpu: GPUSpec, plan: MemoryPlan, context: int) -> tuple[str, ...]:
    """Why a configuration cannot run, one sentence per reason (empty when it can)."""
    problems = []
    if context > spec.max_context:
        problems.append(f"{context:,} tokens per user is beyond {spec.name}'s maximum context of "
                        f"{spec.max_context:,} tokens")
    if plan.weights > plan.usable:
        problems.append(f"the weights alone take {_gb(plan.weights)} per GPU, more than the {_gb(plan.usable)} "
                        f"a server can use on one {gpu.name}")
    elif not plan.fits:
        problems.append(f"weights {_gb(plan.weights)} + KV cache {_gb(plan.kv)} for {plan.batch:,} users = "
                        f"{_gb(plan.needed)} per GPU, more than the {_gb(plan.usable)} a server can use on one {gpu.name}")
    return tuple(problems)


CANDIDATE_LAYOUTS = ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 3), (8, 4), (8, 6), (8, 8), (8, 12), (8, 16))


def smallest_layout(spec: ModelSpec, gpu: GPUSpec, weight_dtype: str, kv_dtype: str, batch: int, context: int,
                    headroom: Headroom = REALISTIC) -> Layout | None:
    """The fewest GPUs per replica (tensor parallel first, then pipeline stages of 8) that hold it all."""
    for tensor, pipeline in CANDIDATE_LAYOUTS:
        layout = Layout(tensor, pipeline)
        if pipeline <= spec.n_layers and memory_plan(spec, gpu, weight_dtype, kv_dtype, batch, context,
                                                      layout, headroom).fits:
            return layout
    return None


def longest_context(spec: ModelSpec, gpu: GPUSpec, weight_dtype: str, kv_dtype: str, batch: int,
                    layout: Layout, headroom: Headroom = REALISTIC) -> int:
    """The longest context per user (up to the model's maximum) at which `batch` users fit; 0 if none."""
    def fits(c: int) -> bool:
        return memory_plan(spec, gpu, weight_dtype, kv_dtype, batch, c, layout, headroom).fits
    lo, hi = 0, spec.max_context
    while lo < hi:                      # the largest c with fits(c): KV grows with c, so fits is monotone
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def fit_suggestions(spec: ModelSpec, gpu: GPUSpec, weight_dtype: str, kv_dtype: str, batch: int, context: int,
                    layout: Layout, headroom: Headroom = REALISTIC) -> tuple[str, ...]:
    """What would make a configuration that does not fit run: more GPUs, fewer bytes, less cache."""
    ctx = min(context, spec.max_context)
    out = [f"a context of at most {spec.max_context:,} tokens"] if context > spec.max_context else []
    plan = memory_plan(spec, gpu, weight_dtype, kv_dtype, batch, ctx, layout, headroom)
    if plan.fits:
        return tuple(out)
    bigger = smallest_layout(spec, gpu, weight_dtype, kv_dtype, batch, ctx, headroom)
    if bigger is not None and bigger.per_replica > layout.per_replica:
        out.append(f"{bigger.describe()} per replica")
    for lower in WEIGHT_ORDER[WEIGHT_ORDER.index(compute_order(weight_dtype)) + 1:]:
        if memory_plan(spec, gpu, lower, kv_dtype, batch, ctx, layout, headroom).fits:
            out.append(f"{lower.upper()} weights ({_gb(weight_bytes(spec, lower))}) on {layout.describe()}")
            break
    if dtype_bytes(kv_dtype) > 1 and memory_plan(spec, gpu, weight_dtype, "fp8", batch, ctx, layout, headroom).fits:
        out.append("an FP8 KV cache")
    users = plan.users()
    if 0 < users < batch:
        out.append(f"at most {users:,} users at {ctx:,} tokens each")
    longest = longest_context(spec, gpu, weight_dtype, kv_dtype, batch, layout, headroom) if plan.weights < plan.usable else 0
    if longest:
        out.append(f"at most {longest:,} tokens per user for {batch:,} users")
    return tuple(out)


def compute_order(weight_dtype: str) -> str:
    """The WEIGHT_ORDER entry with the same bytes per weight (fp16 ~ bf16, int8 ~ fp8, nf4 ~ int4)."""
    size = dtype_bytes(weight_dtype)
    return next(d for d in WEIGHT_ORDER if dtype_bytes(d) == size)


# --- the projection ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Projection:
    """Everything projected for one (model, GPUs, precisions, batch, context). Times in ms; memory per GPU.

    A configuration that does not fit (`fits` False, `problems` says why, `to_fit` what would help)
    has None for every time, speed and cost: it does not run, so nothing is priced.
    """

    model: str
    gpu: str
    weight_dtype: str
    kv_dtype: str
    batch: int                   # users decoded together by one replica
    context: int                 # cached tokens per user during decode
    prompt_tokens: int
    output_tokens: int
    flops_efficiency: float
    bandwidth_efficiency: float
    dollars_per_hour: float      # per GPU
    tensor_parallel: int
    pipeline_parallel: int
    replicas: int
    gpus: int                    # all GPUs, every replica
    utilization: float           # share of each card the server fills
    params: int
    active_params: int           # per token: the routed experts it picks, everything else whole
    n_experts: int               # routed experts per MoE layer (0: dense)
    experts_per_token: int
    experts_touched: float       # distinct routed experts per MoE layer one decode step of the batch reads
    weight_bytes: float          # all weights as stored
    weight_bytes_read: float     # what one decode step of the batch reads
    kv_bytes_per_token: float
    kv_bytes_per_user: float     # at `context`
    kv_bytes_total: float        # the replica's batch
    memory_card_bytes: float     # one GPU
    memory_bytes: float          # what weights + KV may take on one GPU: card x utilization - reserve
    reserve_bytes: float         # CUDA context + activation workspace per GPU
    memory_needed_bytes: float   # weights + KV per GPU
    fits: bool
    problems: tuple[str, ...]
    to_fit: tuple[str, ...]
    users_that_fit: int          # per replica, at `context`, with the server's headroom
    users_that_fit_ideal: int    # the same with all of the card for weights + KV
    prefill_flops: float         # the whole batch's prompts
    decode_flops: float          # one decode step of the batch
    prefill_intensity: float     # FLOPs per byte moved
    decode_intensity: float
    ridge_point: float           # FLOPs per byte where one GPU's roofline bends
    prefill_ms: float | None = None
    ttft_ms: float | None = None           # queueing (none: the batch arrives together) + prefill
    request_ms: float | None = None        # prefill + (output_tokens - 1) decode steps
    comm_prefill_ms: float | None = None   # inside prefill_ms: all-reduces and stage hand-offs
    decode_step_ms: float | None = None    # at `context`, with the efficiencies
    decode_memory_ms: float | None = None  # bytes / (bandwidth x bw_eff)
    decode_compute_ms: float | None = None  # FLOPs / (peak x flops_eff)
    comm_decode_ms: float | None = None    # inside decode_step_ms
    decode_bound: str | None = None        # "memory" or "compute"
    ceiling_step_ms: float | None = None   # the same step at 100% of the peaks
    ceiling_tok_s_per_user: float | None = None
    per_user_tok_s: float | None = None
    total_tok_s: float | None = None       # every replica
    cost_per_million_tokens: float | None = None   # $ per 1M output tokens
    decode_flops_utilization: float | None = None  # share of peak FLOP/s a decode step uses

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _memory_fields(spec: ModelSpec, gpu: GPUSpec, cm: CostModel, plan: MemoryPlan, weight_dtype: str,
                   kv_dtype: str, context: int, layout: Layout) -> dict[str, Any]:
    touched = cm.experts_touched(plan.batch)
    per_user = kv_bytes_per_user(spec, context, kv_dtype)
    return dict(
        params=param_counts(spec).total, active_params=active_param_counts(spec).total,
        n_experts=cm.n_experts, experts_per_token=cm.experts_per_token, experts_touched=touched,
        weight_bytes=cm.weight_bytes, weight_bytes_read=cm.weights_read(plan.batch),
        kv_bytes_per_token=cm.kv_bytes_per_token, kv_bytes_per_user=per_user, kv_bytes_total=plan.batch * per_user,
        memory_card_bytes=plan.card, memory_bytes=plan.usable, reserve_bytes=plan.reserve,
        memory_needed_bytes=plan.needed,
        users_that_fit=users_that_fit(spec, gpu, context, weight_dtype, kv_dtype, REALISTIC, layout),
        users_that_fit_ideal=users_that_fit(spec, gpu, context, weight_dtype, kv_dtype, IDEAL, layout))


def _request_fields(cm: CostModel, batch: int, prompt: int, output: int) -> dict[str, Any]:
    """Prefill of the batch's prompts yields each user's first token; then output - 1 decode steps at
    the mean context prompt + output / 2."""
    prefill = cm.prefill_seconds([prompt] * batch)
    steps = max(output - 1, 0)
    decode_total = steps * cm.decode_seconds_at(batch, round(prompt + output / 2)) if steps else 0.0
    return dict(prefill_ms=prefill * 1e3, ttft_ms=prefill * 1e3, request_ms=(prefill + decode_total) * 1e3,
                comm_prefill_ms=cm.comm_seconds(batch * prompt) * 1e3)


def _decode_fields(cm: CostModel, batch: int, context: int, dollars_per_gpu_hour: float, gpus: int,
                   replicas: int) -> dict[str, Any]:
    kv_tokens = batch * cm.effective_tokens(context)
    step = cm.decode_seconds(batch, kv_tokens)
    memory = cm.memory_seconds(cm.decode_bytes(kv_tokens, batch))
    compute = cm.compute_seconds(cm.decode_step_flops(batch, kv_tokens))
    ceiling = cm.ideal().decode_seconds(batch, kv_tokens)
    return dict(
        decode_step_ms=step * 1e3, decode_memory_ms=memory * 1e3, decode_compute_ms=compute * 1e3,
        comm_decode_ms=cm.comm_seconds(batch) * 1e3, decode_bound="memory" if memory >= compute else "compute",
        ceiling_step_ms=ceiling * 1e3, ceiling_tok_s_per_user=1 / ceiling,
        per_user_tok_s=1 / step, total_tok_s=replicas * batch / step,
        cost_per_million_tokens=dollars_per_gpu_hour * gpus / 3600 * step / batch * 1e6,
        decode_flops_utilization=cm.decode_step_flops(batch, kv_tokens) / step / cm.peak_flops,
    )


def _intensity_fields(cm: CostModel, batch: int, context: int, prompt: int, gpu: GPUSpec,
                      weight_dtype: str) -> dict[str, Any]:
    kv_tokens = batch * cm.effective_tokens(context)
    prompts = [prompt] * batch
    return dict(
        prefill_flops=cm.prefill_step_flops(prompts), decode_flops=cm.decode_step_flops(batch, kv_tokens),
        prefill_intensity=cm.prefill_step_flops(prompts) / cm.prefill_bytes(prompts),
        decode_intensity=cm.decode_step_flops(batch, kv_tokens) / cm.decode_bytes(kv_tokens, batch),
        ridge_point=ridge_point(gpu, weight_dtype),
    )


def project(spec: ModelSpec, gpu: GPUSpec, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
            batch: int = 1, context: int = 1024, prompt_tokens: int | None = None,
            output_tokens: int = 128, flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY,
            bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY,
            dollars_per_hour: float = DEFAULT_DOLLARS_PER_HOUR, layout: Layout = Layout(),
            headroom: Headroom = REALISTIC) -> Projection:
    """Project memory, speed and cost for `batch` users per replica. `prompt_tokens` defaults to `context`."""
    if batch < 1 or context < 1 or output_tokens < 0:
        raise ValueError("batch and context must be >= 1, output tokens >= 0")
    prompt = context if prompt_tokens is None else int(prompt_tokens)
    cm = cost_model(spec, gpu, weight_dtype, kv_dtype, flops_efficiency, bandwidth_efficiency, layout)
    plan = memory_plan(spec, gpu, weight_dtype, kv_dtype, batch, context, layout, headroom)
    problems = fit_problems(spec, gpu, plan, max(context, prompt))
    fields = dict(
        model=spec.name, gpu=gpu.name, weight_dtype=weight_dtype, kv_dtype=kv_dtype, batch=batch, context=context,
        prompt_tokens=prompt, output_tokens=output_tokens, flops_efficiency=flops_efficiency,
        bandwidth_efficiency=bandwidth_efficiency, dollars_per_hour=dollars_per_hour,
        tensor_parallel=layout.tensor, pipeline_parallel=layout.pipeline, replicas=layout.replicas,
        gpus=layout.gpus, utilization=headroom.utilization, fits=not problems, problems=problems,
        to_fit=fit_suggestions(spec, gpu, weight_dtype, kv_dtype, batch, max(context, prompt), layout, headroom)
        if problems else (),
        **_memory_fields(spec, gpu, cm, plan, weight_dtype, kv_dtype, context, layout),
        **_intensity_fields(cm, batch, context, prompt, gpu, weight_dtype))
    if not problems:
        fields.update(**_request_fields(cm, batch, prompt, output_tokens),
                      **_decode_fields(cm, batch, context, dollars_per_hour, layout.per_replica, layout.replicas))
    return Projection(**fields)


def sweep_batch(spec: ModelSpec, gpu: GPUSpec, batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                **kwargs: Any) -> list[Projection]:
    """`project` at each batch size (same keyword arguments): for cost- and speed-vs-batch charts."""
    return [project(spec, gpu, batch=b, **kwargs) for b in batches]


@dataclass(frozen=True)
class RooflinePoint:
    intensity: float          # FLOPs per byte
    attainable_flops: float   # FLOP/s


def ridge_point(gpu: GPUSpec, weight_dtype: str = "bf16") -> float:
    """Arithmetic intensity (FLOPs/byte) above which a kernel is compute-bound."""
    return peak_flops(gpu, weight_dtype) / gpu.bandwidth_bytes_s


def attainable_flops(gpu: GPUSpec, intensity: float, weight_dtype: str = "bf16") -> float:
    """The roofline: min(peak FLOP/s, intensity x bandwidth)."""
    return min(peak_flops(gpu, weight_dtype), intensity * gpu.bandwidth_bytes_s)


def roofline(gpu: GPUSpec, weight_dtype: str = "bf16",
             intensities: Sequence[float] | None = None) -> list[RooflinePoint]:
    """Points of the roofline, by default 0.1 to 10^5 FLOPs/byte, 10 per decade, plus the ridge."""
    if intensities is None:
        grid = [10 ** (k / 10) for k in range(-10, 51)]
        intensities = sorted(grid + [ridge_point(gpu, weight_dtype)])
    return [RooflinePoint(i, attainable_flops(gpu, i, weight_dtype)) for i in intensities]
