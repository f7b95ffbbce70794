"""Quantization, closely: outlier channels, grids that do and do not line up, NF4, and what rounding costs.

    hidden = layer_inputs(lm, ids)                      # the residual stream entering each layer, one pass
    acts = activation_channels(lm, hidden)              # per layer and channel: max and mean |x| into q_proj
    errs = int8_errors_by_layer(lm, hidden)             # per-tensor, per-token and LLM.int8-style INT8, per layer
    share = grid_share(lm, group=32)                    # groups of 32 weights already on a 16-level grid
    report = scheme_quality(lm, "nf4-b64", ids)         # weight error, perplexity, KL, top-1 agreement

Schemes (weight-only, on a copy of the decoder-block linears; `quantize.py` holds the packed INT8/INT4 kernels):

- rtn-asym-gG: round to nearest on 16 evenly spaced levels from each group's minimum to its maximum
  (a scale and a minimum per G inputs) - the layout of GGUF's Q4_1, the format the embedded model came in.
- rtn-sym-gG:  16 levels spaced evenly around zero, the step set by the group's largest |w| (absmax / 7).
- nf4-b64:     QLoRA's NormalFloat4: 16 levels at quantiles of a normal distribution (dense near zero, where
  most weights are), scaled by each block of 64's absmax.

Activations are shown, not quantized, except in `int8_matmul_errors`, which rounds one layer's real inputs.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch
from torch import nn

from engine.errors import InvalidRequestError
from engine.core.loader import LoadedModel
from engine.lab.quantize import (FIXED_TEXT, _block_linears, _shared_copy, all_logits, compare_logits, dequantize_int4,
                                 quantize_int4)

NF4_OFFSET = 0.9677083       # QLoRA: the outermost quantile, midway between the two choices for 15 and 16 steps
OUTLIER_THRESHOLD = 6.0      # LLM.int8: input features with any |x| >= 6 are kept in 16-bit
SCHEMES = ("rtn-asym-g32", "rtn-asym-g64", "rtn-sym-g32", "rtn-sym-g64", "nf4-b64")
SCALE_BITS = 16              # one BF16 scale (and minimum) per group
EVAL_TOKENS = 512
EVAL_TEXT = FIXED_TEXT + (
    " Bread is older than writing. The first loaves were flat cakes of crushed grain and water baked on hot "
    "stones, and for thousands of years that was all bread was. Then someone left a bowl of dough out too long, "
    "wild yeast from the air began to feed on it, and the dough rose. Bakers learned to keep a piece of each "
    "batch to start the next one, a habit that survives in every sourdough kitchen today. Mills grew from hand "
    "stones to water wheels to steel rollers, and white flour, once a luxury for the rich, became the cheapest "
    "food in the shop. "
    "A train timetable is a promise written as a grid. Each column is a journey and each row a station, and the "
    "numbers say when the train will be there. Planners build it backwards from the constraints: how long a "
    "platform can be occupied, how many trains a single track can carry each hour, where drivers change shifts. "
    "When one train runs late the delay spreads along the line, because the next service waits for the same "
    "track, and a small problem in the morning can still be felt in the evening rush."
)


# --- the grids ---------------------------------------------------------------------------------------------

def nf4_levels() -> torch.Tensor:
    """The 16 NF4 values: 8 positive and 7 negative normal quantiles and an exact zero, scaled to [-1, 1]."""
    normal = torch.distributions.Normal(0.0, 1.0)
    pos = normal.icdf(torch.linspace(NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1])    # 8 values
    neg = -normal.icdf(torch.linspace(NF4_OFFSET, 0.5, 8, dtype=torch.float64)[:-1])   # 7 values
    levels = torch.cat([pos, neg, torch.zeros(1, dtype=torch.float64)]).sort().values
    return (levels / levels.max()).float()


def _groups(w: torch.Tensor, size: int) -> torch.Tensor:
    n, k = w.shape
    if k % size:
        raise InvalidRequestError(f"{k} input features do not split into groups of {size}")
    return w.detach().float().reshape(n, k // size, size)                              # (N, K/G, G)


def fake_nf4(w: torch.Tensor, block: int = 64) -> torch.Tensor:
    """w (N, K) -> each block of `block` inputs scaled by its absmax, rounded to the nearest NF4 level."""
    g = _groups(w, block)
    absmax = g.abs().amax(-1, keepdim=True).clamp(min=1e-12)
    levels = nf4_levels().to(w.device)
    mids = (levels[1:] + levels[:-1]) / 2
    codes = torch.bucketize((g / absmax).contiguous(), mids)                          # nearest level
    return (levels[codes] * absmax).reshape(w.shape)


def fake_rtn_sym(w: torch.Tensor, group: int) -> torch.Tensor:
    """Symmetric INT4 round to nearest: codes in [-8, 7], step = group absmax / 7."""
    g = _groups(w, group)
    scale = (g.abs().amax(-1, keepdim=True) / 7).clamp(min=1e-12)
    return (torch.round(g / scale).clamp(-8, 7) * scale).reshape(w.shape)


def fake_rtn_asym(w: torch.Tensor, group: int) -> torch.Tensor:
    codes, scale, low = quantize_int4(w, group)
    return dequantize_int4(codes, scale, low)


def parse_scheme(scheme: str) -> tuple[str, int]:
    """'rtn-sym-g32' -> ('rtn-sym', 32); 'nf4-b64' -> ('nf4', 64)."""
    if scheme not in SCHEMES:
        raise InvalidRequestError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    kind, size = scheme.rsplit("-", 1)
    return kind, int(size[1:])


def fake_quantize(w: torch.Tensor, scheme: str) -> torch.Tensor:
    """The float weight (N, K) a scheme's codes stand for."""
    kind, size = parse_scheme(scheme)
    if kind == "nf4":
        return fake_nf4(w, size)
    return fake_rtn_sym(w, size) if kind == "rtn-sym" else fake_rtn_asym(w, size)


def bits_per_weight(scheme: str) -> float:
    """4 bits of code plus the group's 16-bit scale (and minimum, when asymmetric) spread over the group."""
    kind, size = parse_scheme(scheme)
    return 4 + SCALE_BITS * (2 if kind == "rtn-asym" else 1) / size


# --- is the loaded model already on a grid? -----------------------------------------------------------------

def on_grid(w: torch.Tensor, group: int = 32, levels: int = 15, tol: float = 1e-3) -> torch.Tensor:
    """(N, K/G) bool: does each group's every weight sit (within tol of a step) on min + i x (max - min)/15?"""
    g = _groups(w, group)
    low, high = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    steps = (g - low) / ((high - low) / levels).clamp(min=1e-12)
    return ((steps - steps.round()).abs() < tol).all(-1)


def grid_share(lm: LoadedModel, group: int = 32) -> float:
    """Share of all groups of `group` block-linear weights that already lie on a 16-level grid."""
    hits = total = 0
    with torch.no_grad():
        for _, _, layer in _block_linears(lm.model):
            flags = on_grid(layer.weight, group)
            hits, total = hits + int(flags.sum()), total + flags.numel()
    return hits / max(total, 1)


# --- what a scheme costs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SchemeQuality:
    """One scheme applied to every decoder-block linear of a copy, against the loaded model."""

    scheme: str
    bits_per_weight: float
    weight_error: float          # ||W - Ŵ|| / ||W|| over all quantized layers
    top1_agreement: float
    ppl_reference: float
    ppl: float
    mean_kl: float               # nats per position

    @property
    def ppl_change(self) -> float:
        return self.ppl / self.ppl_reference - 1


def dequantized_copy(lm: LoadedModel, scheme: str) -> tuple[LoadedModel, float]:
    """A copy whose block linears hold the scheme's dequantized weights (new tensors); and the weight error."""
    clone = _shared_copy(lm.model)
    err = norm = 0.0
    with torch.no_grad():
        for _, _, layer in _block_linears(clone):
            w = layer.weight
            approx = fake_quantize(w, scheme)
            err += float((approx - w.float()).square().sum())
            norm += float(w.float().square().sum())
            layer.weight = nn.Parameter(approx.to(w.dtype), requires_grad=False)
    copy_lm = replace(lm, model=clone, label=f"{lm.label} ({scheme})", lock=threading.Lock())
    return copy_lm, math.sqrt(err / max(norm, 1e-30))


def scheme_quality(lm: LoadedModel, scheme: str, ids: list[int],
                   reference: torch.Tensor | None = None) -> SchemeQuality:
    """Quantize a copy with `scheme`, run it over `ids` (one teacher-forced pass), compare with the loaded
    model's logits (T, V) over the same ids (computed here unless given)."""
    copy_lm, err = dequantized_copy(lm, scheme)
    ref = all_logits(lm, ids) if reference is None else reference
    q = compare_logits(ref, all_logits(copy_lm, ids), ids)
    return SchemeQuality(scheme, bits_per_weight(scheme), err, q.top1_agreement, q.ppl_reference,
                         q.ppl_candidate, q.mean_kl)


# --- outliers ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChannelStats:
    """Per layer and input channel, over the tokens of one text: the largest and the mean |x|."""

    where: str                   # what was measured
    max_abs: np.ndarray          # (L, d_model)
    mean_abs: np.ndarray         # (L, d_model)

    def outliers(self, threshold: float = OUTLIER_THRESHOLD) -> np.ndarray:
        """(L,) number of channels whose largest |x| reaches the threshold."""
        return (self.max_abs >= threshold).sum(axis=1)

    def ratio(self) -> np.ndarray:
        """(L,) the largest channel max over the median channel max: how far the outliers stand out."""
        return self.max_abs.max(axis=1) / np.median(self.max_abs, axis=1)


def layer_inputs(lm: LoadedModel, ids: list[int]) -> tuple[torch.Tensor, ...]:
    """The residual stream entering each decoder layer, [1, T, d_model] each (one forward pass)."""
    with torch.inference_mode():
        x = torch.tensor([ids], device=lm.device)
        hs = lm.model(input_ids=x, use_cache=False, output_hidden_states=True, logits_to_keep=1).hidden_states
    return hs[: lm.spec.n_layers]


def activation_channels(lm: LoadedModel, hidden_states: Sequence[torch.Tensor]) -> tuple[ChannelStats, ChannelStats]:
    """(what enters q/k/v_proj after the layer's RMSNorm, the residual stream itself), per layer and channel,
    from `layer_inputs(lm, ids)`."""
    normed_max, normed_mean, resid_max, resid_mean = [], [], [], []
    with torch.inference_mode():
        for i, hidden in enumerate(hidden_states):
            normed = lm.model.model.layers[i].input_layernorm(hidden)[0].float().abs()   # (T, d_model)
            resid = hidden[0].float().abs()
            normed_max.append(normed.amax(0)), normed_mean.append(normed.mean(0))
            resid_max.append(resid.amax(0)), resid_mean.append(resid.mean(0))
    stack = lambda xs: torch.stack(xs).cpu().numpy()                                    # noqa: E731
    return (ChannelStats("input to q_proj (after RMSNorm)", stack(normed_max), stack(normed_mean)),
            ChannelStats("residual stream", stack(resid_max), stack(resid_mean)))


def weight_rows(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per input channel of a weight (N, K): the largest and the mean |w| down its column."""
    a = w.detach().float().abs()
    return a.amax(0).cpu().numpy(), a.mean(0).cpu().numpy()


# --- INT8 on real activations: why outliers hurt, and LLM.int8's way round them -----------------------------

def _int8_rows(x: torch.Tensor) -> torch.Tensor:
    """Symmetric INT8 round trip with one scale per row of x (T, K)."""
    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp(min=1e-12)
    return torch.round(x / scale).clamp(-127, 127) * scale


def _int8_tensor(x: torch.Tensor) -> torch.Tensor:
    scale = (x.abs().max() / 127).clamp(min=1e-12)
    return torch.round(x / scale).clamp(-127, 127) * scale


@dataclass(frozen=True)
class Int8Errors:
    """Relative error of y = x Wᵀ when x and W are rounded to INT8 three ways."""

    per_tensor: float            # one scale for the whole activation matrix
    per_token: float             # one scale per token (row)
    mixed: float                 # LLM.int8: outlier columns kept in float, the rest per token
    outlier_columns: int


def int8_matmul_errors(x: torch.Tensor, w: torch.Tensor, threshold: float = OUTLIER_THRESHOLD) -> Int8Errors:
    """x (T, K) real activations, w (N, K) weights (INT8 per output row in every case)."""
    x, w = x.float(), w.detach().float()
    ref = x @ w.T                                                                       # (T, N)
    wq = _int8_rows(w)
    rel = lambda y: float((y - ref).norm() / ref.norm().clamp(min=1e-30))              # noqa: E731
    outlier = (x.abs() >= threshold).any(0)                                            # (K,)
    regular_w = _int8_rows(w.masked_fill(outlier, 0.0))                              # W's rows without them
    mixed = _int8_rows(x.masked_fill(outlier, 0.0)) @ regular_w.T + x[:, outlier] @ w[:, outlier].T
    return Int8Errors(rel(_int8_tensor(x) @ wq.T), rel(_int8_rows(x) @ wq.T), rel(mixed), int(outlier.sum()))


def q_proj_inputs(lm: LoadedModel, ids: list[int], layer: int) -> torch.Tensor:
    """What enters layer `layer`'s q/k/v_proj over `ids`, after its RMSNorm: (T, d_model)."""
    if not 0 <= layer < lm.spec.n_layers:
        raise InvalidRequestError(f"layer must be 0 to {lm.spec.n_layers - 1}")
    with torch.inference_mode():
        return lm.model.model.layers[layer].input_layernorm(layer_inputs(lm, ids)[layer])[0]


def int8_errors_by_layer(lm: LoadedModel, hidden_states: Sequence[torch.Tensor]) -> list[Int8Errors]:
    """The three INT8 schemes on every layer's q_proj, with its real inputs (from `layer_inputs(lm, ids)`)."""
    errors = []
    with torch.inference_mode():
        for block, hidden in zip(lm.model.model.layers, hidden_states):
            x = block.input_layernorm(hidden)[0]                                        # (T, d_model)
            errors.append(int8_matmul_errors(x, block.self_attn.q_proj.weight))
    return errors


def notable_weights(lm: LoadedModel, layer: int = 0) -> list[tuple[str, float]]:
    """Real weights of one q_proj to show bit by bit: its largest |w|, a typical one (median |w|), its smallest."""
    w = lm.model.model.layers[layer].self_attn.q_proj.weight.detach().float().flatten()
    order = w.abs().argsort()
    nonzero = order[w[order] != 0]
    where = f"model.layers.{layer}.self_attn.q_proj"
    return [(f"largest |w| in {where}", float(w[order[-1]])),
            (f"a typical weight (median |w|) in {where}", float(w[order[len(order) // 2]])),
            (f"smallest non-zero |w| in {where}", float(w[nonzero[0]]))]
