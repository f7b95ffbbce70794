"""Weight-only quantization of a copy of the loaded model: INT8 per output channel, INT4 per group.

    q = quantize_copy(lm, "int4", group_size=32)     # lm itself is never changed
    report = compare_models(lm, q.lm, text_ids(lm))   # top-1 agreement and perplexity on a fixed text

Round to nearest (RTN), no calibration data:

- INT8, symmetric, one scale per output row:  w ~ q x s,           q in [-127, 127], s = max|w_row| / 127
- INT4, asymmetric, one scale and zero per group of `group_size` inputs:
                                               w ~ q x s + m,       q in [0, 15], s = (max - min) / 15, m = min

The storage is real: int8 codes, or two 4-bit codes packed in each byte, plus the scales, so the
bytes reported are the bytes held. The linear layers of the decoder blocks are quantized; the
embeddings, norms and LM head stay in the model's precision (as most weight-only schemes do).

On CPU the forward pass uses PyTorch's weight-only kernels (`torch._weight_int8pack_mm`,
`torch._weight_int4pack_mm_for_cpu`), which take activations in `compute_dtype`; each kernel is
checked against the plain dequantized matmul once and is skipped when it is missing or disagrees.
Elsewhere the weight is dequantized and multiplied by an ordinary matmul (correct, not faster).
Libraries tried first (docs/speed_lab.md): torchao 0.18 quantizes INT8 on CPU but its INT4 needs a
GPU kernel package, and its CPU 4-bit path stores codes unpacked in int8; optimum-quanto has been
in maintenance mode since 2025. So the few lines of RTN live here.
"""
from __future__ import annotations

import copy
import math
import threading
import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import EngineError, InvalidRequestError
from engine.core.loader import LoadedModel

SCHEMES = ("int8", "int4")
GROUP_SIZES = (32, 64, 128)
BLOCK_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INT4_LEVELS = 15
INT8_LEVELS = 127


# --- round to nearest --------------------------------------------------------------------------------

def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) -> codes int8 (N, K) and scale (N,): symmetric, per output channel."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / INT8_LEVELS).clamp(min=1e-12)                     # (N,)
    codes = torch.round(w / scale[:, None]).clamp(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)
    return codes, scale


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return codes.float() * scale.float()[:, None]                                     # (N, K)


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (N, K) -> codes uint8 in [0, 15] (N, K), scale (N, K/G), minimum (N, K/G): asymmetric per group."""
    n, k = w.shape
    if k % group_size:
        raise InvalidRequestError(f"{k} input features do not split into groups of {group_size}")
    groups = w.detach().float().reshape(n, k // group_size, group_size)               # (N, K/G, G)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / INT4_LEVELS).clamp(min=1e-12)
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, INT4_LEVELS)
    return codes.reshape(n, k).to(torch.uint8), scale, low


def dequantize_int4(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    n, k = codes.shape
    groups = codes.reshape(n, scale.shape[1], -1).float()                             # (N, K/G, G)
    return (groups * scale.float()[..., None] + low.float()[..., None]).reshape(n, k)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes in [0, 15] -> (N, K/2) bytes: even column in the low nibble, odd in the high."""
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K/2) bytes -> (N, K) codes."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


@dataclass(frozen=True)
class QuantizedWeight:
    """One weight matrix (N, K) in its quantized storage."""

    scheme: str                  # "int8" or "int4"
    shape: tuple[int, int]       # (N, K) of the float weight
    codes: torch.Tensor          # int8 (N, K), or packed nibbles uint8 (N, K/2)
    scale: torch.Tensor          # (N,) for int8, (N, K/G) for int4
    low: torch.Tensor | None     # (N, K/G) group minimum, int4 only
    group_size: int | None

    @classmethod
    def from_weight(cls, w: torch.Tensor, scheme: str, group_size: int = 32) -> "QuantizedWeight":
        shape = (w.shape[0], w.shape[1])
        if scheme == "int8":
            codes, scale = quantize_int8(w)
            return cls("int8", shape, codes, scale, None, None)
        if scheme == "int4":
            codes, scale, low = quantize_int4(w, group_size)
            return cls("int4", shape, pack_int4(codes), scale, low, group_size)
        raise InvalidRequestError(f"unknown precision {scheme!r}; choose one of {', '.join(SCHEMES)}")

    def dequantize(self) -> torch.Tensor:
        """The float32 weight (N, K) these codes stand for."""
        if self.scheme == "int8":
            return dequantize_int8(self.codes, self.scale)
        return dequantize_int4(unpack_int4(self.codes), self.scale, self.low)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.low) if t is not None)


class QuantLinear(nn.Module):
    """A linear layer that stores quantized weights. Modes:

    - "kernel": PyTorch's fused weight-only CPU kernel, activations cast to `compute_dtype`;
    - "dequantize": rebuild the float weight on every call, then an ordinary matmul.
    """

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, compute_dtype: torch.dtype,
                 use_kernel: bool = True):
        super().__init__()
        self.scheme, self.group_size, self.compute_dtype = qw.scheme, qw.group_size, compute_dtype
        self.out_features, self.in_features = qw.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.mode = "dequantize"
        if use_kernel and qw.codes.device.type == "cpu" and self._install_kernel(qw):
            self.mode = "kernel"
        else:
            self._install_plain(qw)

    def _install_plain(self, qw: QuantizedWeight) -> None:
        self.register_buffer("codes", qw.codes)
        self.register_buffer("scale", qw.scale)
        self.register_buffer("low", qw.low)

    def _install_kernel(self, qw: QuantizedWeight) -> bool:
        """Kernel buffers, kept only if the kernel exists here and matches the dequantized matmul."""
        try:
            if qw.scheme == "int8":
                self.register_buffer("codes", qw.codes)
                self.register_buffer("scale", qw.scale.to(self.compute_dtype))
            else:  # the CPU int4 kernel packs its own way and reads (K/G, N, 2) scales with zero = low + 8 x scale
                zeros = qw.low + 8 * qw.scale
                sz = torch.stack([qw.scale.t(), zeros.t()], dim=-1).contiguous()
                codes = unpack_int4(qw.codes).to(torch.int32)
                self.register_buffer("codes", torch._convert_weight_to_int4pack_for_cpu(codes, 1))
                self.register_buffer("scales_and_zeros", sz.to(self.compute_dtype))
            probe = torch.randn(4, self.in_features, generator=torch.Generator().manual_seed(0))
            got = self._kernel(probe.to(self.compute_dtype)).float()
        except (RuntimeError, AttributeError, NotImplementedError):
            self._buffers.clear()
            return False
        expected = F.linear(probe.to(self.compute_dtype).float(), qw.dequantize())
        ok = torch.allclose(got, expected, rtol=3e-2, atol=3e-2 * expected.abs().max().item() + 1e-5)
        if not ok:
            self._buffers.clear()
        return ok

    def _kernel(self, flat: torch.Tensor) -> torch.Tensor:
        # flat: (T, K) in compute_dtype -> (T, N)
        if self.scheme == "int8":
            return torch._weight_int8pack_mm(flat, self.codes, self.scale)
        return torch._weight_int4pack_mm_for_cpu(flat, self.codes, self.group_size, self.scales_and_zeros)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight (N, K), in dequantize mode."""
        qw = QuantizedWeight(self.scheme, (self.out_features, self.in_features), self.codes, self.scale,
                             self.low, self.group_size)
        return qw.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., K] -> [..., N]
        if self.mode == "kernel":
            flat = x.reshape(-1, self.in_features).to(self.compute_dtype)                 # (T, K)
            y = self._kernel(flat).to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, self.dequantized().to(x.dtype))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.buffers(), *self.parameters()))

    def extra_repr(self) -> str:
        group = f", group={self.group_size}" if self.group_size else ""
        return f"{self.scheme}, in={self.in_features}, out={self.out_features}{group}, mode={self.mode}"


# --- a quantized copy of the loaded model --------------------------------------------------------------

@dataclass
class QuantizedModel:
    """A quantized copy that the engine runs like any loaded model (`lm`), and what it stores."""

    lm: LoadedModel
    scheme: str
    group_size: int | None
    compute_dtype: str
    mode: str                    # "kernel", "dequantize" or "mixed"
    layers_quantized: int        # linear layers replaced
    linear_bytes_before: int     # those layers' float weights
    linear_bytes_after: int      # their codes + scales (+ zeros)
    reference_bytes: int         # every weight of the original model
    stored_bytes: int            # every weight the copy holds
    weight_error: float          # ||W - dequantized||/ ||W|| over all quantized layers
    seconds: float               # time to quantize

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per quantized weight, scales included."""
        params = self.linear_bytes_before / self.lm.dtype.itemsize
        return 8 * self.linear_bytes_after / params


def _shared_copy(model: nn.Module) -> nn.Module:
    """A new module tree over the same tensors: replacing a submodule of the copy leaves `model` as it is."""
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def _block_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every projection inside the decoder blocks."""
    found = []
    for block in model.model.layers:
        for parent in (block.self_attn, block.mlp):
            for name in BLOCK_LINEARS:
                layer = getattr(parent, name, None)
                if isinstance(layer, nn.Linear):
                    found.append((parent, name, layer))
    return found


def _model_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for t in (*model.parameters(), *model.buffers()):
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def default_compute_dtype(device: torch.device) -> torch.dtype:
    """The CPU weight-only kernels are fastest with BF16 activations; elsewhere keep the model's precision."""
    return torch.bfloat16 if device.type == "cpu" else torch.float32


def check_scheme(scheme: str, group_size: int) -> None:
    if scheme not in SCHEMES:
        raise InvalidRequestError(f"unknown precision {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if scheme == "int4" and group_size not in GROUP_SIZES:
        raise InvalidRequestError(f"group size must be one of {', '.join(map(str, GROUP_SIZES))}")


def quantize_copy(lm: LoadedModel, scheme: str, group_size: int = 32,
                  compute_dtype: torch.dtype | None = None, use_kernel: bool = True) -> QuantizedModel:
    """Quantize the decoder-block linear layers of a copy of `lm.model`; `lm` is not changed."""
    check_scheme(scheme, group_size)
    compute = compute_dtype or default_compute_dtype(lm.device)
    start = time.perf_counter()
    clone = _shared_copy(lm.model)
    modes, before, after, err, norm = set(), 0, 0, 0.0, 0.0
    with torch.no_grad():
        for parent, name, layer in _block_linears(clone):
            if layer.in_features % group_size and scheme == "int4":
                raise InvalidRequestError(f"{name} has {layer.in_features} inputs, not a multiple of {group_size}")
            qw = QuantizedWeight.from_weight(layer.weight, scheme, group_size)
            err += float((qw.dequantize() - layer.weight.float()).square().sum())
            norm += float(layer.weight.float().square().sum())
            q = QuantLinear(qw, layer.bias, compute, use_kernel)
            setattr(parent, name, q)
            modes.add(q.mode)
            before += layer.weight.numel() * layer.weight.element_size()
            after += q.stored_bytes() - (0 if q.bias is None else q.bias.numel() * q.bias.element_size())
    if not modes:
        raise EngineError(f"{lm.label} has no linear layers this quantizer knows")
    label = f"{lm.label} ({scheme.upper()}{f', group {group_size}' if scheme == 'int4' else ''})"
    # nothing made for the original's weights comes along: its forward, packed or graphed products
    copy_lm = replace(lm, model=clone, label=label, lock=threading.Lock(), lean=None, small_batch=None,
                      batch_graphs=None, side_by_side=[])
    return QuantizedModel(copy_lm, scheme, group_size if scheme == "int4" else None,
                          str(compute).removeprefix("torch."), modes.pop() if len(modes) == 1 else "mixed",
                          len(quantized_layers(clone)), before, after, _model_bytes(lm.model),
                          _model_bytes(clone), math.sqrt(err / max(norm, 1e-30)), time.perf_counter() - start)


def quantized_layers(model: nn.Module) -> list[QuantLinear]:
    return [m for m in model.modules() if isinstance(m, QuantLinear)]


# --- how much the answer changes -----------------------------------------------------------------------

FIXED_TEXT = (
    "A lighthouse keeper kept a notebook of every ship that passed the point. Most nights the entries were "
    "short: a trawler heading north, a ferry late because of the wind, a sailing boat that should have been "
    "in port hours before. Over the years the notebook became a record of the weather, of the fishing, and "
    "of the town itself, which grew along the harbour and then shrank again when the cannery closed. When "
    "the light was finally automated, the keeper gave the notebooks to the library, where students still "
    "read them to learn how the coast has changed. The last entry says only that the sea was calm, the sky "
    "was clear, and the lamp turned as it always had, one sweep every ten seconds until the morning came."
)
MAX_EVAL_TOKENS = 256


@dataclass(frozen=True)
class QualityReport:
    """How a candidate model's next-token predictions compare with the reference's on one text."""

    tokens: int                  # positions compared
    top1_agreement: float        # share of positions where both pick the same most likely token
    ppl_reference: float
    ppl_candidate: float
    mean_kl: float               # KL(reference || candidate) per position, nats

    @property
    def ppl_change(self) -> float:
        """Relative change in perplexity: +0.02 = 2% worse."""
        return self.ppl_candidate / self.ppl_reference - 1


def text_ids(lm: LoadedModel, text: str = FIXED_TEXT, limit: int = MAX_EVAL_TOKENS) -> list[int]:
    """Token ids of the evaluation text (no chat template), at most `limit` and within the context."""
    ids = lm.tokenizer(text)["input_ids"][: min(limit, lm.spec.max_context)]
    if len(ids) < 2:
        raise InvalidRequestError("the evaluation text needs at least two tokens")
    return ids


def all_logits(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    """One forward pass without a cache; the logits at every position, (T, V) float32."""
    with torch.inference_mode():
        x = torch.tensor([ids], device=lm.device)                                     # [1, T]
        out = lm.model(input_ids=x, use_cache=False, logits_to_keep=0)
    return out.logits[0].float()


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    """exp(mean negative log-likelihood of each next token); logits (T, V)."""
    target = torch.tensor(ids[1:], device=logits.device)
    nll = F.cross_entropy(logits[:-1], target)
    return float(torch.exp(nll))


def compare_logits(reference: torch.Tensor, candidate: torch.Tensor, ids: list[int]) -> QualityReport:
    """Top-1 agreement, perplexities and KL from two (T, V) logit tables over the same ids."""
    agree = (reference.argmax(-1) == candidate.argmax(-1)).float().mean()
    log_p, log_q = F.log_softmax(reference, -1), F.log_softmax(candidate, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return QualityReport(len(ids), float(agree), perplexity(reference, ids), perplexity(candidate, ids), float(kl))


def compare_models(reference: LoadedModel, candidate: LoadedModel, ids: list[int]) -> QualityReport:
    return compare_logits(all_logits(reference, ids), all_logits(candidate, ids), ids)
