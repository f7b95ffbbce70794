"""Attention computed again from what a run kept: a layer's Q and K come from the layer's own modules, run on the
residual stream that entered it.

    x = layer_input(lm.model, kept, layer=12, ids=ids)    # (N, d_model): kept, or rebuilt from a kept layer below
    qk = layer_qk(lm.model, layer=12, x=x)                # AttentionInputs: Q, K (and V) after RoPE, scaling, window
    one = layer_qk(lm.model, layer=12, x=x[7:8], start=7) # Q, K, V of position 7 alone (its norms)

Why it is exact: the decoder layer itself runs on the stored input (its input norm, its q/k projections with their
biases, the architecture's own rotary embedding at positions 0..N-1); transformers calls the registered attention
function with Q and K as its own eager or SDPA path would receive them, together with the layer's scaling, sliding
window and soft-cap, and that function hands them over here before any attention is computed (`grab_only`). A layer
whose input was not kept is rebuilt by running the layers from the nearest kept one below it (a partial prefill),
with masks made by transformers' own mask functions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

from engine.core.hooks import CAPTURE_KWARG, decoder_layers
from engine.core.kept import KeptInputs
from engine.errors import InvalidRequestError


@dataclass(frozen=True)
class AttentionInputs:
    """One layer's attention inputs over a run's positions, as the layer computed them."""

    layer: int
    q: torch.Tensor                  # (H, N, D) after RoPE
    k: torch.Tensor                  # (KVH, N, D) after RoPE
    scaling: float                   # the layer's own scale of q·k (1/√d, or query_pre_attn_scalar^-0.5)
    window: int | None = None        # sliding window: a query sees keys i - window < j <= i; None: every j <= i
    softcap: float | None = None     # logits soft-capped as softcap · tanh(s / softcap) before the mask
    v: torch.Tensor | None = None    # (KVH, N, D)

    @property
    def n(self) -> int:
        return self.q.shape[1]

    @property
    def group(self) -> int:
        return self.q.shape[0] // self.k.shape[0]

    def kv_head(self, head: int) -> int:
        """The K/V head a query head reads: h // (H / KVH), as transformers' repeat_kv lays them out."""
        return head // self.group

    def visible(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(Tq, Tk) True where query position q_pos[i] may attend key position k_pos[j]: transformers' own mask
        functions (causal, or causal within the sliding window)."""
        fn = causal_mask_function if self.window is None else sliding_window_causal_mask_function(self.window)
        return fn(0, 0, q_pos[:, None], k_pos[None, :])


class _Grabbed(Exception):
    """Raised inside the attention function once Q and K are in hand: nothing after them is needed."""


class QKGrab:
    """Travels as the capture keyword; the playground attention function calls `grab` before computing anything."""

    grab_only = True

    def __init__(self) -> None:
        self.inputs: AttentionInputs | None = None

    def grab(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None,
             kwargs: dict[str, Any]) -> None:
        # query: [1, H, N, D]; key, value: [1, KVH, N, D]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        window = kwargs.get("sliding_window", window_of(module))
        self.inputs = AttentionInputs(module.layer_idx, query[0], key[0], float(scale), window, kwargs.get("softcap"),
                                      value[0])
        raise _Grabbed


def window_of(attn: Any) -> int | None:
    """A layer's sliding window: its own attribute (Qwen2, Gemma2), else its config's (Mistral); None: full."""
    if hasattr(attn, "sliding_window"):
        return attn.sliding_window
    return getattr(attn.config, "sliding_window", None)


def positions(n: int, device: torch.device, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)[None]                       # [1, N]


def layer_qk(model: Any, layer: int, x: torch.Tensor, start: int = 0) -> AttentionInputs:
    """Q, K and V of `layer` over positions start..start+N-1, from the residual entering it. x: (N, d_model).

    With start > 0 the keys are those of these positions only (a position's own Q, K, V: their norms)."""
    block = decoder_layers(model)[layer]
    pos = positions(x.shape[0], x.device, start)
    grab = QKGrab()
    with torch.inference_mode():
        pe = model.model.rotary_emb(x[None], pos)
        try:
            block(x[None], attention_mask=None, position_ids=pos, position_embeddings=pe, **{CAPTURE_KWARG: grab})
        except _Grabbed:
            pass
    if grab.inputs is None:
        raise InvalidRequestError(f"layer {layer} did not call the playground attention function; load the model "
                                  "with the engine's loader (attn_implementation='playground')")
    return grab.inputs


def layer_mask(block: Any, x: torch.Tensor) -> torch.Tensor | None:
    """The mask a layer's attention needs over positions 0..N-1: None for plain causal (SDPA's is_causal), else a
    [1, 1, N, N] boolean mask from transformers' sliding-window mask function."""
    window = window_of(block.self_attn)
    if window is None or window >= x.shape[0]:
        return None
    idx = torch.arange(x.shape[0], device=x.device)
    return sliding_window_causal_mask_function(window)(0, 0, idx[:, None], idx[None, :])[None, None]


def run_layers(model: Any, x: torch.Tensor, first: int, last: int,
               progress: Callable[[int], None] | None = None) -> torch.Tensor:
    """The residual entering layer `last`, from the one entering `first` (first <= last): a partial prefill.

    x: (N, d_model). Each layer runs as in the model's own forward pass, without a cache."""
    layers = decoder_layers(model)
    pos = positions(x.shape[0], x.device)
    h = x[None]                                                                      # [1, N, d_model]
    with torch.inference_mode():
        pe = model.model.rotary_emb(h, pos)
        for i in range(first, last):
            out = layers[i](h, attention_mask=layer_mask(layers[i], x), position_ids=pos, position_embeddings=pe)
            h = out[0] if isinstance(out, tuple) else out
            if progress is not None:
                progress(i)
    return h[0]


def embeddings(model: Any, ids: list[int], device: torch.device) -> torch.Tensor:
    """The residual entering layer 0: the token embeddings (Llama, Qwen2 and Mistral add nothing to them)."""
    with torch.inference_mode():
        return model.model.embed_tokens(torch.tensor(ids, device=device))            # (N, d_model)


def layer_input(model: Any, kept: KeptInputs, layer: int, ids: list[int],
                progress: Callable[[int], None] | None = None) -> tuple[torch.Tensor, int | None]:
    """(N, d_model) entering `layer` at the run's N kept positions, and the layer it was rebuilt from (None when it
    was kept). A rebuilt layer is kept too (one at a time), so choosing another head of it costs nothing."""
    x = kept.input(layer)
    if x is not None:
        return x, None
    start = kept.below(layer)
    base = kept.input(start) if start is not None else embeddings(model, ids[: kept.length], kept.device)
    x = run_layers(model, base.to(kept.dtype), start or 0, layer, progress)
    kept.keep_recomputed(layer, x)
    return x, start or 0
