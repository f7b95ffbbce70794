"""A Jupyter notebook for one run file, built with nbformat: run top to bottom in a fresh kernel with only the project
installed, it reloads the run, redraws the page's attention heatmap and logit-lens table with plotly, runs the same
prompt again on the same model with the engine's Python API and checks that the attention matches the file, then
reproduces one head with plain transformers (`output_attentions=True`) and, where it is installed, nnsight.

    data = bundle(run_bytes, "capital-of-france", page="attention", layer=3, head=1)   # a .zip: notebook + run file
    nb = notebook(run, "capital-of-france.run.zip", page="journey")                   # nbformat.NotebookNode
"""
from __future__ import annotations

import io
import zipfile

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from engine.runs import SUFFIX, RunFile, loads

PAGES = {"journey": "The journey of a request", "attention": "Attention", "speculative": "Speculative decoding"}
KERNEL = {"name": "python3", "display_name": "Python 3", "language": "python"}

LOAD = '''from engine.runs import load

run = load(RUN_FILE)
print(f"{run.model} ({run.dtype}): {len(run.prompt_ids)} prompt tokens, {len(run.token_ids)} generated")
print("Prompt:", run.request.prompt)
print("Answer:", "".join(run.token_texts))
print("Timings (s):", {k: round(v, 4) for k, v in run.timings.items()})
print("Layers with attention:", run.layers)'''

HEATMAP = '''import plotly.graph_objects as go

cap = run.capture(LAYER)
attn = run.head_map(LAYER, HEAD)                       # (queries, keys), probabilities as captured
labels = [f"{i}: {t!r}" for i, t in enumerate(run.prompt_tokens)]
fig = go.Figure(go.Heatmap(z=attn ** 0.5, customdata=attn, colorscale="Blues", showscale=False,
                           x=labels[cap.key_start:cap.key_start + attn.shape[1]],
                           y=labels[cap.query_start:cap.query_start + attn.shape[0]],
                           hovertemplate="query %{y}<br>key %{x}<br>p = %{customdata:.4f}<extra></extra>"))
fig.update_layout(title=f"Layer {LAYER}, head {HEAD}: who each prompt token looks at (colour: sqrt p)",
                  yaxis_autorange="reversed", height=560)
fig.show()'''

LENS = '''rows = run.logit_lens()
if rows:
    fig = go.Figure(go.Table(header=dict(values=["layer", "top token", "id", "p"]),
                             cells=dict(values=[[r["layer"] for r in rows], [repr(r["token"]) for r in rows],
                                                [r["id"] for r in rows], [f"{r['prob']:.3f}" for r in rows]])))
    fig.update_layout(title="Logit lens at the prompt's last position", height=120 + 26 * len(rows))
    fig.show()
else:
    print("This run kept no logit lens (capture was off when it ran).")'''

ROUNDS = '''rounds = run.rounds
fig = go.Figure(go.Table(header=dict(values=["round", "drafted", "accepted", "target's token", "draft s", "verify s"]),
                         cells=dict(values=[[r.round for r in rounds],
                                            ["".join(d.text for d in r.drafted) for r in rounds],
                                            [r.accepted for r in rounds], [r.bonus.text for r in rounds],
                                            [f"{r.draft_seconds:.4f}" for r in rounds],
                                            [f"{r.verify_seconds:.4f}" for r in rounds]])))
fig.update_layout(title=f"{len(rounds)} speculative rounds", height=140 + 26 * len(rounds))
fig.show()'''

RERUN = '''import numpy as np
import torch

from engine.core.generate import generate_captured
from engine.core.loader import load_model
from engine.runs import attention_differences, attention_tolerance

device = "cuda" if run.recording.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
lm = load_model(MODEL, device=device, dtype=run.dtype)
fresh = generate_captured(lm, run.request, run.policy)      # the run's residual, its maps derived from it
assert [p.id for p in fresh[0].prompt] == run.prompt_ids, "this tokenizer splits the prompt differently"
TOL = attention_tolerance(run)
worst = attention_differences(run, fresh)
by_pass = {}                                           # each pass's largest difference, and where
for (where, layer), diff in worst.items():
    if diff >= by_pass.get(where, (0, -1.0))[1]:
        by_pass[where] = (layer, diff)
for where, (layer, diff) in by_pass.items():
    print(f"{where:>8}: max |fresh - file| = {diff:.2e} (layer {layer}, over {len(run.layers)} layers)")
print(f"{len(worst)} captured maps compared; the largest difference is {max(worst.values()):.2e} (tolerance {TOL:.0e})")
assert max(worst.values()) <= TOL, "the fresh run's attention differs from the file's"'''

HF = '''from transformers import AutoModelForCausalLM

hf = AutoModelForCausalLM.from_pretrained(lm.source, dtype=lm.dtype, attn_implementation="eager").to(device).eval()
with torch.no_grad():
    out = hf(torch.tensor([run.prompt_ids], device=device), output_attentions=True)
mine = run.head_map(LAYER, HEAD)
theirs = out.attentions[LAYER][0, HEAD].float().cpu().numpy()
theirs = theirs[cap.query_start:cap.query_start + mine.shape[0], cap.key_start:cap.key_start + mine.shape[1]]
hf_diff = float(np.abs(theirs - mine).max())
print(f"transformers output_attentions, layer {LAYER} head {HEAD}: "
      f"max |difference| from the playground = {hf_diff:.2e}")
assert hf_diff <= TOL'''

NNSIGHT = '''try:
    import nnsight
except ImportError:
    print("nnsight is not installed here (pip install nnsight): this check is skipped; "
          "the transformers cell above compared the same head.")
else:
    Model = getattr(nnsight, "TransformersModel", None)                   # nnsight 0.8; LanguageModel before
    task = {"task": "text-generation"} if Model is not None else {}
    nn_model = (Model or nnsight.LanguageModel)(str(lm.source), dtype=lm.dtype, attn_implementation="eager",
                                                dispatch=True, **task)
    with nn_model.trace(torch.tensor([run.prompt_ids])):
        weights = nn_model.model.layers[LAYER].self_attn.output[1].save()   # (batch, heads, queries, keys)
    weights = getattr(weights, "value", weights)
    got = weights[0, HEAD].detach().float().cpu().numpy()
    got = got[cap.query_start:cap.query_start + mine.shape[0], cap.key_start:cap.key_start + mine.shape[1]]
    nn_diff = float(np.abs(got - mine).max())
    print(f"nnsight, layer {LAYER} head {HEAD}: max |difference| from the playground = {nn_diff:.2e}")
    assert nn_diff <= TOL'''

TIMELINE = '''import plotly.graph_objects as go

story = run.story                                      # the server's own step log, as this run lived through it
t = story["timings"]
print(f"{t['e2e_request_latency_seconds']:.4f} s in all ({t['steps']} batch steps); to the first token: "
      f"{t['time_to_first_token_seconds'] or 0:.4f} s; waited: {t['wait_reason'] or 'no'}")
for part in ("queue", "prefill", "decode", "batch", "others_prefill", "between_steps"):
    print(f"{part:>15}: {t['split'][part]:.4f} s")
assert abs(sum(t["split"][p] for p in ("queue", "prefill", "decode", "batch", "others_prefill", "between_steps"))
           - t["split"]["total"]) < 1e-6, "the parts add up to the wall time"
print("Alone on an idle server:", t["alone_seconds"], "s:", t["alone_how"])
me, steps = story["id"], story["steps"]
fig = go.Figure()
fig.add_bar(x=[s["start"] for s in steps], y=[s["seconds"] - s["prefill_seconds"] for s in steps], name="decode pass")
fig.add_bar(x=[s["start"] for s in steps], y=[s["prefill_seconds"] for s in steps], name="prefill (anyone's)")
fig.update_layout(barmode="stack", title=f"The {len(steps)} batch steps request {me} lived through",
                  xaxis_title="seconds since it was submitted", yaxis_title="step time (s)", height=380)
fig.show()'''

HOOKS = """## The same capture points in TransformerLens

| this run | TransformerLens hook |
|---|---|
| `records.N.captures.L.attention` | `blocks.L.attn.hook_pattern` (batch, head, query, key) |
| `records.N.captures.L.q_norm` | norm of `blocks.L.attn.hook_q` at the newest position |
| `records.N.captures.L.k_norm`, `v_norm` | norms of `blocks.L.attn.hook_k`, `hook_v` |
| `records.N.captures.L.resid_norm`, `resid` | `blocks.L.hook_resid_post` (its norm; the vector itself) |
| `records.N.captures.L.lens` | `ln_final` then `unembed` applied to `blocks.L.hook_resid_post` |

docs/runs.md in the project has the whole table."""


def notebook(run: RunFile, run_file: str, page: str = "journey", layer: int | None = None,
             head: int | None = None) -> nbformat.NotebookNode:
    """The notebook for `run` (saved beside it as `run_file`), opening on the head the page showed."""
    middle = run.layers[len(run.layers) // 2] if run.layers else 0          # the attention page's default too
    layer = layer if layer is not None and layer in run.layers else middle
    heads = run.capture(layer).heads if run.layers else (0,)
    head = head if head is not None and head in heads else heads[0]
    cells = [new_markdown_cell(_intro(run, page)),
             new_code_cell(_parameters(run, run_file, layer, head)),
             new_code_cell(LOAD)]
    if run.layers:
        cells += [new_markdown_cell("## The page's views, from the file alone"), new_code_cell(HEATMAP),
                  new_code_cell(LENS)]
    if run.rounds:
        cells.append(new_code_cell(ROUNDS))
    if run.story:
        cells += [new_markdown_cell("## Why it took its time\nThe server's own step log as this run lived through "
                                    "it: its wall time taken apart, and every batch step (docs/serving.md)."),
                  new_code_cell(TIMELINE)]
    if run.layers:
        cells += [new_markdown_cell("## The same prompt again, with the engine's Python API\nThe fresh run's "
                                    "attention must match the file's in every captured layer."),
                  new_code_cell(RERUN),
                  new_markdown_cell("## The same head in the research tools\nPlain transformers with "
                                    "`output_attentions=True`, then nnsight when it is installed."),
                  new_code_cell(HF), new_code_cell(NNSIGHT), new_markdown_cell(HOOKS)]
    return new_notebook(cells=cells, metadata={"kernelspec": dict(KERNEL), "language_info": {"name": "python"}})


def _parameters(run: RunFile, run_file: str, layer: int, head: int) -> str:
    """The first code cell: the file, the weights (where they were, else what the playground was started with) and
    the head to look at."""
    return (f"from pathlib import Path\n\n"
            f"RUN_FILE = {run_file!r}   # the run file that came with this notebook\n"
            f"MODEL = {run.source or run.name or 'default'!r}   # the weights that made the run\n"
            f"if not Path(MODEL).exists():   # not on this machine: what the playground was started with\n"
            f"    MODEL = {run.name or 'default'!r}   # 'default': the embedded model; or set the weights' folder\n"
            f"LAYER, HEAD = {layer}, {head}   # the head the page showed")


def _intro(run: RunFile, page: str) -> str:
    answer = "".join(run.token_texts)
    return (f"# {PAGES.get(page, page)}: a run from the Inference Playground\n\n"
            f"**{run.model}** ({run.dtype}), prompt: {run.request.prompt[:300]!r}\n\n"
            f"Answer: {answer[:300]!r}\n\n"
            "Run every cell from the top. The notebook needs only the playground installed "
            "(`pip install -e .` in its folder) and the run file beside it.")


def bundle(run_bytes: bytes, stem: str, page: str = "journey", layer: int | None = None,
           head: int | None = None) -> bytes:
    """A .zip holding `<stem>.ipynb` and the run file `<stem>.run.zip` it opens."""
    run_file = stem + SUFFIX
    nb = notebook(loads(run_bytes, run_file), run_file, page, layer, head)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{stem}/{stem}.ipynb", nbformat.writes(nb))
        z.writestr(f"{stem}/{run_file}", run_bytes)
    return out.getvalue()
