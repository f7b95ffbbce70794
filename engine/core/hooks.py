"""What a run captures, and the one attention function the engine registers.

A run captures one thing: the residual stream, at every position it reads, in the model's own dtype. The hidden
states are numbered as transformers' `output_hidden_states` numbers them:

    hidden state i < L           the residual stream entering `model.layers.{i}`            (d_model,) per position
    hidden state L               the stream leaving the last layer: the final norm's input  (d_model,) per position

Everything a page shows is computed from it when someone looks (engine/core/views.py): attention maps, rows and
per-head summaries, |Q|, |K|, |V| per head, the residual's norm leaving each layer and the logit lens. The engine
writes it inside its one forward (engine/core/lean.py: `keep.write`, into a run's buffers or the paged residual pool
beside K and V); a family that forward does not cover returns it from transformers' modules
(`output_hidden_states`). No hook of ours is ever attached to the model.

The attention function "playground" computes the output with PyTorch SDPA; when a forward call carries a grab
(`playground_capture`, engine/core/recompute.py) it hands over Q and K as the layer computed them, before anything
else, so that attention can be computed again exactly from a kept residual.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

ATTENTION_NAME = "playground"
CAPTURE_KWARG = "playground_capture"


@dataclass(frozen=True)
class CapturePolicy:
    """What one run keeps (`inputs`: the residual stream), and the views its exports carry (the rest).

    The engine keeps only the residual: the hidden states `residual_ids` names, every position. `layers`, `heads`,
    `attention`, `prefill_matrix`, `max_keys`, `stats` and `logit_lens` say which views a run file, a recording or the
    command line's capture file derives from it when it is written (engine/core/views.py `derive_captures`); a page
    derives what it shows by run id. `lens_on_demand` is read from old files and means nothing any more.
    """

    layers: tuple[int, ...] | None = None  # views of these layers in exports; None: every layer; (): none
    heads: tuple[int, ...] | None = None   # query heads of the attention views; None: all
    attention: bool = True                 # attention probabilities (the prefill matrix, then one row per step)
    prefill_matrix: bool = True            # the prefill's full causal matrix, else its last row only
    max_keys: int | None = None            # at most this many most recent keys of each row
    stats: bool = True                     # |Q|, |K|, |V| and the residual's norm at each pass's newest position
    logit_lens: int = 0                    # top tokens each layer would predict (0: none)
    lens_on_demand: bool = False           # (old files) the lens was computed when asked
    inputs: tuple[int, ...] | None = ()    # hidden states kept besides those the views need; None: every one

    @property
    def views(self) -> bool:
        return (self.layers is None or len(self.layers) > 0) and (self.attention or self.stats or self.logit_lens > 0)

    @property
    def enabled(self) -> bool:
        return self.views or self.keeps_inputs

    @property
    def keeps_inputs(self) -> bool:
        return self.inputs is None or len(self.inputs) > 0

    def input_ids(self, n_layers: int) -> tuple[int, ...]:
        """The hidden states (0..n_layers) this policy asks to keep in `inputs`."""
        if self.inputs is None:
            return tuple(range(n_layers + 1))
        return tuple(sorted({i for i in self.inputs if 0 <= i <= n_layers}))

    def residual_ids(self, n_layers: int) -> tuple[int, ...]:
        """Every hidden state a run keeps: `inputs`, and for each layer with views its input (attention, |Q|) and
        its output (the residual's norm and the lens)."""
        if not self.enabled:
            return ()
        wanted = set(self.input_ids(n_layers))
        if self.views:
            for i in self.layer_ids(n_layers):
                wanted |= {i, i + 1} if (self.stats or self.logit_lens) else {i}
        return tuple(sorted(wanted))

    def layer_ids(self, n_layers: int) -> tuple[int, ...]:
        if self.layers is None:
            return tuple(range(n_layers))
        return tuple(i for i in self.layers if 0 <= i < n_layers)

    def head_ids(self, n_heads: int) -> tuple[int, ...]:
        return tuple(range(n_heads)) if self.heads is None else tuple(h for h in self.heads if 0 <= h < n_heads)


CAPTURE_OFF = CapturePolicy(layers=(), attention=False, stats=False)
CAPTURE_ALL = CapturePolicy(logit_lens=5)


@dataclass
class LayerCapture:
    """What one layer showed for one forward pass (numpy): derived from the residual (views.derive_captures), or read
    from a file written before the engine kept only the residual."""

    layer: int
    heads: tuple[int, ...] = ()        # query heads whose attention is here
    kv_heads: tuple[int, ...] = ()     # the K/V head each of those query heads reads (GQA)
    attention: np.ndarray | None = None  # (len(heads), T_q, T_k_kept) probabilities
    query_start: int = 0               # absolute position of the first query row
    key_start: int = 0                 # absolute position of the first key column kept
    q_norm: np.ndarray | None = None   # (n_heads,) at the newest position
    k_norm: np.ndarray | None = None   # (n_kv_heads,) at the newest position
    v_norm: np.ndarray | None = None   # (n_kv_heads,)
    resid_norm: float | None = None    # residual stream leaving the layer, newest position
    lens: list[tuple[int, float]] | None = None  # (token id, probability) through final norm + LM head
    resid: np.ndarray | None = None    # (d_model,) residual leaving the layer (old files: the lens computed later)


def playground_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0,
                         scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA attention; a call carrying a grab (engine/core/recompute.py) hands over Q, K and V first."""
    grab = kwargs.pop(CAPTURE_KWARG, None)
    if grab is not None:
        grab.grab(module, query, key, value, scaling, kwargs)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                    scaling=scaling, **kwargs)
    return out, None


AttentionInterface.register(ATTENTION_NAME, playground_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def decoder_layers(model: Any) -> Any:
    return model.model.layers


def hook_points(model: Any) -> dict[str, str]:
    """Every point a run keeps, named by the model's own paths, and the views derived from each."""
    layers = decoder_layers(model)
    points = {}
    for i in range(len(layers)):
        points[f"model.layers.{i} (input)"] = ("residual stream entering the layer (T, d_model), kept: its attention "
                                               "maps and rows, |Q| per head, |K|, |V| per K/V head derive from it")
        points[f"model.layers.{i}"] = ("residual stream leaving the layer (the next one's input): its norm and the "
                                       "logit lens derive from it")
    points["model.norm (input)"] = (f"residual stream leaving layer {len(layers) - 1} (T, d_model), kept: the last "
                                    "layer's norm and lens")
    return points


def count_hooks(model: Any) -> int:
    """Playground hooks attached anywhere in the model: the engine attaches none (transformers v5 installs
    output-recording hooks of its own for `output_hidden_states`; those are not ours)."""
    return sum(hasattr(hook, "playground_point")
               for m in model.modules()
               for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()))
