"""By how much a lone step's split products (engine.core.matvec) change the numbers: the same greedy answer computed
with F.linear and with the split products, step by step, the logits and probabilities compared; and with each
layer's q|k|v and gate|up as one split product each (engine.core.lone, "side_by_side") against the split products
one weight at a time.

    python bench/lone_bits.py            # SmolLM2, 16 tokens; a new file under bench/results/lone_bits/
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from bench import provenance  # noqa: E402
from engine.core import matvec  # noqa: E402
from engine.core.lean import lean_step_for  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.core.lone import SideBySide  # noqa: E402

PROMPT = "The lighthouse keeper found a message in a bottle. It said"


def answer(lean, ids: torch.Tensor, tokens: int, linear, fused=None) -> list[torch.Tensor]:
    """Each step's logits (V,) of a greedy answer: the prompt in one pass, then one token at a time."""
    cache = DynamicCache()
    out, tok, pos = [], ids, torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        for _ in range(tokens):
            logits = lean.forward(tok, pos, lambda i, k, v: cache.update(k, v, i), linear=linear,
                                  fused=fused if tok.shape[1] == 1 else None)[0, -1]
            out.append(logits)
            tok, pos = logits.argmax().view(1, 1), pos[:, -1:] + 1
    return out


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict:
    """How far two answers' logits and probabilities lie apart, step by step, and whether their tokens agree."""
    logits = [float((x - y).abs().max()) for x, y in zip(a, b)]
    probs = [float((x.softmax(-1) - y.softmax(-1)).abs().max()) for x, y in zip(a, b)]
    return {"max_logit_diff": max(logits), "max_prob_diff": max(probs), "logit_diff_per_step": logits,
            "same_tokens": [int(x.argmax()) for x in a] == [int(x.argmax()) for x in b]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    record = provenance.start("lone_bits", argv)
    torch.set_num_threads(1)
    lm = load_model("default", device="cpu", dtype="float32")
    lean = lean_step_for(lm)
    ids = lm.tokenizer(PROMPT, return_tensors="pt").input_ids
    a, b = answer(lean, ids, args.tokens, F.linear), answer(lean, ids, args.tokens, matvec.linear)
    c = answer(lean, ids, args.tokens, matvec.linear, SideBySide(lean).fused())
    report = {"tokens": args.tokens, **compare(a, b), "max_abs_logit": max(float(x.abs().max()) for x in a),
              "side_by_side": compare(b, c)}
    print(report)
    record.save(report, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
