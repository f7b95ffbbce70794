"""GPTQ and AWQ against round-to-nearest, on one real layer: the same 4-bit grid, three ways to use it.

    x = layer_activations(lm, ids, layer=15)            # what enters q_proj, (T, K)
    result = compare_methods(x, w, group=32)            # weight and output error of RTN, GPTQ, AWQ

All three use symmetric INT4 with one scale per group of inputs (absmax / 7). RTN and GPTQ share the very
grid, taken from the original weights, so only the choice of codes differs; AWQ rescales input channels
first, which moves its grid channel by channel:

- RTN rounds every weight to its nearest level: the smallest weight error.
- GPTQ (Frantar et al., 2023) rounds one input column at a time and spreads each column's error over the
  columns not yet rounded, weighted by the inverse Hessian H = 2 XᵀX / T of calibration inputs: the smallest
  output error for inputs like X. (The paper's lazy batch updates are left out; the arithmetic is the same.)
- AWQ (Lin et al., 2024) multiplies each input channel by s = mean|x|^α before rounding and divides after,
  so channels that meet large activations get finer steps; α is searched on the calibration inputs.

Calibration uses the first half of the tokens; errors are reported on the second half (held out).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import InvalidRequestError

ALPHAS = tuple(i / 10 for i in range(11))
DAMPING = 0.01               # GPTQ adds 1% of the mean diagonal to H so it can be inverted


def group_scales(w: torch.Tensor, group: int) -> torch.Tensor:
    """(N, K/G) symmetric INT4 steps: each group's absmax / 7."""
    n, k = w.shape
    if k % group:
        raise InvalidRequestError(f"{k} inputs do not split into groups of {group}")
    return (w.reshape(n, k // group, group).abs().amax(-1) / 7).clamp(min=1e-12)


def round_column(col: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One input column (N,) to its nearest level on the grid of steps (N,)."""
    return torch.round(col / step).clamp(-8, 7) * step


def rtn(w: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    steps = scales.repeat_interleave(group, dim=1)                                     # (N, K)
    return torch.round(w / steps).clamp(-8, 7) * steps


def inverse_hessian_factor(x: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor of H⁻¹, H = 2 XᵀX / T + damping: GPTQ's update weights. x: (T, K)."""
    h = 2 * x.T @ x / x.shape[0]                                                       # (K, K)
    h += DAMPING * h.diagonal().mean() * torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)


def gptq(w: torch.Tensor, x: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """Round w (N, K) column by column, pushing each column's error onto the columns after it."""
    u = inverse_hessian_factor(x.double())                                            # (K, K) upper
    work, out = w.double().clone(), torch.empty_like(w, dtype=torch.float64)
    steps = scales.double()
    for i in range(w.shape[1]):
        q = round_column(work[:, i], steps[:, i // group])
        out[:, i] = q
        err = (work[:, i] - q) / u[i, i]                                              # (N,)
        work[:, i + 1:] -= err[:, None] * u[i, i + 1:][None, :]
    return out.to(w.dtype)


def awq(w: torch.Tensor, x: torch.Tensor, group: int) -> tuple[torch.Tensor, float]:
    """Scale input channels by mean|x|^α, round, unscale; the α with the smallest calibration output error."""
    mean_abs = x.abs().mean(0).clamp(min=1e-8)                                        # (K,)
    best, best_alpha, best_err = w, 0.0, float("inf")
    for alpha in ALPHAS:
        s = mean_abs ** alpha
        s = s / (s.max() * s.min()).sqrt()                                            # keep the scales near 1
        scaled = w * s
        approx = rtn(scaled, group_scales(scaled, group), group) / s
        err = float((x @ (w - approx).T).norm())
        if err < best_err:
            best, best_alpha, best_err = approx, alpha, err
    return best, best_alpha


@dataclass(frozen=True)
class MethodError:
    method: str
    weight_error: float          # ||W - Ŵ|| / ||W||
    output_error: float          # ||X (W - Ŵ)ᵀ|| / ||X Wᵀ|| on held-out inputs


@dataclass(frozen=True)
class MethodComparison:
    rows: list[MethodError]
    calibration_tokens: int
    test_tokens: int
    awq_alpha: float


def _errors(method: str, w: torch.Tensor, approx: torch.Tensor, x_test: torch.Tensor) -> MethodError:
    weight = float((w - approx).norm() / w.norm())
    output = float((x_test @ (w - approx).T).norm() / (x_test @ w.T).norm())
    return MethodError(method, weight, output)


def compare_methods(x: torch.Tensor, w: torch.Tensor, group: int = 32) -> MethodComparison:
    """RTN, GPTQ and AWQ on one layer: x (T, K) real inputs, w (N, K); calibrate on the first half of x."""
    if x.shape[0] < 4:
        raise InvalidRequestError("calibration needs at least four tokens")
    x, w = x.detach().float(), w.detach().float()
    half = x.shape[0] // 2
    calib, test = x[:half], x[half:]
    scales = group_scales(w, group)
    awq_w, alpha = awq(w, calib, group)
    rows = [_errors("RTN", w, rtn(w, scales, group), test), _errors("GPTQ", w, gptq(w, calib, scales, group), test),
            _errors("AWQ", w, awq_w, test)]
    return MethodComparison(rows, half, x.shape[0] - half, alpha)
