"""Components of the journey page: the input as tokens and shapes, the streaming answer with its
metrics and timeline, and the per-token views (distribution, logit lens) drawn from a stored run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.journey import figures as charts
from app.runs.notebook import notebook_button
from app.runs.recordings import decoder, origin_sentence, save_button
from app.runs.request import Prepared, Sampling
from app.ui.format import fmt_ms, fmt_rate, plot_text, visible
from app.runs.run import LOGIT_LENS_TOP, Run, Throttle, capture_policy
from app.journey.tokens import chars_per_token, chips_figure, special_mask
from app.journey.why import why_section
from app.runs.live import run_on_model, status_progress
from app.runs.widgets import ChartSlot, plot
from engine.core.generate import GenerationRequest
from engine.errors import EngineError
from engine.service.client import ModelClient
from engine.core.hooks import CapturePolicy
from engine.core.records import SampledToken
from engine.core.sampling import filter_probs
from engine.core.token_bytes import char_groups, readable, token_bytes

if TYPE_CHECKING:
    from engine.lab.speed import ObserverEffect

MAX_CHIPS = 300
HEX_ONLY = re.compile(r"<[0-9A-F ]+>")      # a chip that is bytes only, no text
TOP_SHOWN = 12
TEXT_SECONDS, CHART_SECONDS = 0.5, 2.0       # redraw intervals while a run streams


def tokenization_section(lm: ModelClient, prepared: Prepared) -> None:
    """The model input as chips with ids, and how many characters each token carries."""
    ids = list(prepared.ids)
    if not ids:
        st.caption("Type a prompt to see its tokens." if not prepared.request.prompt.strip()
                   else "No tokens to show: the request was refused (the message is above).")
        return
    # The prompt alone, without the chat template, tokenized once more for this display only: it tells the
    # template's tokens from the prompt's and gives characters per token. The model reads `ids`.
    prompt_ids = lm.tokenizer(prepared.request.prompt, add_special_tokens=False)["input_ids"]
    special = special_mask(ids, prompt_ids, set(lm.tokenizer.all_special_ids))
    texts = [lm.tokenizer.decode([i]) for i in ids[:MAX_CHIPS]]
    ratio = chars_per_token(prepared.request.prompt, len(prompt_ids))
    cols = st.columns(3)
    cols[0].metric("Tokens the model reads", f"{len(ids):,}")
    cols[1].metric("Of which chat template", f"{sum(special):,}")
    cols[2].metric("Characters per token (prompt)", f"{ratio:.2f}")
    pieces = token_bytes(lm.tokenizer, ids[:MAX_CHIPS])
    plot(chips_figure(texts, ids[:MAX_CHIPS], special[:MAX_CHIPS], pieces=pieces), key="journey.chips",
         width="content")
    note = "Grey chips are the chat template and special tokens; the number under each chip is its id."
    if len(ids) > MAX_CHIPS:
        note += f" Showing the first {MAX_CHIPS} of {len(ids):,} tokens."
    st.caption(note + split_note(pieces))


def split_note(pieces: list[bytes]) -> str:
    """One line on byte fragments, with the bytes of the first character this prompt's tokenizer split (hex only:
    no prompt text goes into the Markdown)."""
    split = next((run for run in char_groups(pieces) if len(run) > 1), None)
    if split is None:
        return ""
    parts = " + ".join(" ".join(f"{b:02X}" for b in pieces[i]) for i in split)
    size = sum(len(pieces[i]) for i in split)
    hexes = [readable(pieces[i]) for i in split if HEX_ONLY.fullmatch(readable(pieces[i]))]
    example = f" such as `{hexes[0]}`" if hexes else ""
    return (" A token is a run of bytes, not always a whole character: a character outside ASCII takes 2 to 4 "
            f"bytes in UTF-8, and a tokenizer may cut them apart. The first bracket here spells {size} bytes cut "
            f"into {len(split)} tokens (`{parts}`). A chip in hex{example} holds part of a character; the bracket "
            "under the chips of one character shows what they spell together.")


def shapes_section(lm: ModelClient, n_tokens: int) -> None:
    spec = lm.spec
    plot(charts.shapes_figure(spec, max(n_tokens, 1)), key="journey.shapes", width="content")
    st.caption(f"Shapes for this prompt ({max(n_tokens, 1):,} tokens) through {lm.label}: {spec.n_heads} query heads "
               f"share {spec.n_kv_heads} K/V heads ({spec.group_size} per group), head size {spec.head_dim}. "
               "At each later step only one new position goes through, and K and V of the earlier ones come "
               "from the cache.")


class ResultView:
    """Placeholders for the answer and its live metrics (made right under Generate, where the person looks while it
    streams) and for the timeline (made lower down, with `timeline_slot`), filled while streaming and after."""

    def __init__(self, running: Callable[[], int] = lambda: 1) -> None:
        self.status = st.empty()
        self.answer = st.empty()
        cols = st.columns(5)
        self.metric_boxes = [c.empty() for c in cols]
        self.note = st.empty()
        self.why_box = st.container()          # why it took its time: filled once the run has ended (`why`)
        self.timeline: ChartSlot | None = None
        self.text_throttle = Throttle(TEXT_SECONDS, running)
        self.chart_throttle = Throttle(CHART_SECONDS, running)
        self.shown: dict[int, tuple] = {}    # what each box shows: nothing is sent twice

    def update(self, run: Run, final: bool = False, timeline: bool = True) -> None:
        """The answer twice a second, its metrics and timeline every two seconds; everything when final.
        With n requests running on the server, every n-th of that (`running`): the room's pages together
        redraw about as often as one page alone. An element whose content has not changed is not sent again.

        Every redraw costs the server (one message per element) and the browser (a re-render of each element
        sent; docs/serving.md measures it): with a room of browsers on one machine, redrawing faster than a
        person reads slows everyone's tokens.
        """
        if not (final or self.text_throttle()):
            return
        unkept = run.status == "running" or (run.status == "stopped" and not run.kept)   # a Stop's file: `settle`
        link = "" if unkept else f" It opens again at ?run={run.id} (kept on the server's disk)."
        self._show(self.status, "caption", run.status_line() + link)
        self._show(self.answer, "text", run.text or "…")
        if not (final or self.chart_throttle()):
            return
        m = run.metrics()
        reused = run.prefill.reused_tokens if run.prefill else 0
        values = [("Time to first token", fmt_ms(m.ttft), None), ("Inter-token latency", fmt_ms(m.itl), None),
                  ("Decode speed", fmt_rate(m.tokens_per_second), None),
                  ("Prompt tokens", f"{m.prompt_tokens:,}", f"{reused:,} reused" if reused else None),
                  ("Generated tokens", f"{m.generated_tokens:,}", None)]
        for box, (label, value, note) in zip(self.metric_boxes, values):
            self._show(box, "metric", label, value, delta=note, delta_color="off", delta_arrow="off")
        notes = [origin_sentence(run)] if run.source is not None else []     # a recording: whose times these are
        notes += [run.capture_note] if run.capture_note else []
        if reused:
            notes.append(f"Prefix cache: the first {reused:,} of the {m.prompt_tokens:,} prompt tokens had been read "
                         "before on this server (the chat template's opening, or the same prompt from someone else), "
                         "so their keys and values were reused and only the rest was computed: a shorter time to "
                         "first token. The KV-cache page measures the difference.")
        if run.speculation is not None:
            notes.append(SPECULATIVE_NOTE)
        if notes:
            self._show(self.note, "caption", " ".join(notes))
        if timeline and self.timeline is not None and run.prefill is not None:
            self.timeline.plot(charts.timeline_figure(run.step_seconds()))

    def why(self, run: Run) -> None:
        """Under the answer, once it has ended: the line that takes its time apart and the chart of its steps
        (app/journey/why.py). Call once per script run (it holds a widget)."""
        if run.done is not None and not run.live:
            with self.why_box:
                why_section(run.timeline, run.spec, run.dtype, "journey.why")

    def timeline_slot(self) -> None:
        """Where the prefill/decode timeline goes (below the tokens and shapes)."""
        self.timeline = ChartSlot("journey.timeline")

    def _show(self, box: DeltaGenerator, method: str, *args: Any, **kwargs: Any) -> None:
        """`box.method(*args, **kwargs)`, unless the box already shows exactly that."""
        if self.shown.get(id(box)) != (method, args, kwargs):
            getattr(box, method)(*args, **kwargs)
            self.shown[id(box)] = (method, args, kwargs)


SPECULATIVE_NOTE = ("A speculative run (from the speculative-decoding page): each round produced several tokens in "
                    "one verify pass, so each token's time here is its round's time shared evenly, and its attention "
                    "row, logit lens and norms are those that pass computed for its position.")


def token_picker(run: Run) -> int:
    """Choose one generated token; the key carries the run id so a new run starts at its first token."""
    texts = [t.text for t in run.tokens]
    return st.select_slider("Generated token", options=list(range(len(texts))), key=f"journey.token.{run.id}",
                            format_func=lambda i: f"{i}: {visible(texts[i])[:20]}")


@dataclass(frozen=True)
class Candidates:
    """The bars of one token's candidates, most likely first: what the chart draws and its caption quotes."""

    labels: list[str]             # each candidate's text and token id
    probs: np.ndarray             # (n,) at the sliders' settings, shares of the whole vocabulary (0..1)
    raw: np.ndarray               # (n,) the plain softmax of the logits (temperature 1, no top-k or top-p)
    chosen: int | None            # the generated token's bar, if it is among them
    greedy: bool                  # the sliders' temperature is 0: all the mass on the most likely token

    @property
    def plain(self) -> bool:
        """The sliders draw the plain softmax (temperature 1, no filter): no second set of bars needed."""
        return bool(np.array_equal(self.probs, self.raw))


def redraw(token: SampledToken, sampling: Sampling) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, probabilities under the sliders' settings, plain softmax at T=1) of the stored candidates, as shares of
    the whole vocabulary (the logits not stored count as one block), most likely first. Temperature 0 is greedy
    decoding: the most likely token gets all the mass, whatever top-k and top-p say."""
    order = np.argsort(-token.logits, kind="stable")
    raw = filter_probs(token.logits, 1.0, 0, 1.0, token.rest_logsumexp, token.rest_count)[order]
    if sampling.temperature <= 0:
        probs = np.zeros_like(raw)
        probs[0] = 1.0                                    # the argmax: the largest stored logit
    else:
        probs = filter_probs(token.logits, sampling.temperature, sampling.top_k, sampling.top_p,
                             token.rest_logsumexp, token.rest_count)[order]
    if sampling.temperature == 1.0 and sampling.top_k == 0 and sampling.top_p >= 1.0:
        probs = raw                                       # the same numbers, not a second computation of them
    return token.logit_ids[order], probs, raw


def candidates(token: SampledToken, sampling: Sampling, decode: Callable[[list[int]], str]) -> Candidates:
    """The TOP_SHOWN most likely candidates, plus the generated token where it ranks lower."""
    ids, probs, raw = redraw(token, sampling)
    shown = list(range(min(TOP_SHOWN, len(ids))))
    where = np.nonzero(ids == token.id)[0]
    if where.size and where[0] >= TOP_SHOWN:
        shown.append(int(where[0]))
    labels = [f"{plot_text(decode([int(ids[i])]), 16)} ({int(ids[i])})" for i in shown]
    chosen = shown.index(int(where[0])) if where.size else None
    return Candidates(labels, probs[shown], raw[shown], chosen, sampling.temperature <= 0)


def pct(p: float) -> str:
    """A probability as the bars print it."""
    return f"{100 * p:.1f}%"


def distribution_caption(run: Run, token: SampledToken, bars: Candidates, sampling: Sampling) -> str:
    """What the bars are, and the chosen token's p read from the same bars."""
    req = run.request
    rest = (f"the other {token.rest_count:,} tokens of the vocabulary count as one block, so each bar is a share "
            "of the whole vocabulary" if token.rest_logsumexp is not None else
            "each bar is a share of those stored (this run kept no total for the rest)")
    text = (f"Re-drawn from the {len(token.logits)} largest logits stored with this token, at the sliders' settings "
            f"(temperature {sampling.temperature:g}, top-k {sampling.top_k or 'off'}, top-p {sampling.top_p:g}); "
            f"{rest}. No model run.")
    if bars.greedy:
        text += (f" Temperature 0 is greedy decoding: the most likely token, {bars.labels[0]}, gets "
                 f"{pct(bars.probs[0])} and every other 0%; grey bars: the plain softmax (temperature 1) it was "
                 f"picked from, where it has {pct(bars.raw[0])}.")
    elif not bars.plain:
        text += " Grey bars: the plain softmax (temperature 1, no top-k or top-p), for comparison."
    return f"{text} {chosen_sentence(req, token, bars, sampling)}"


def chosen_sentence(req: GenerationRequest, token: SampledToken, bars: Candidates, sampling: Sampling) -> str:
    """How the generated token was picked, with its p from the bars (and the sampled p the engine recorded)."""
    if bars.chosen is None:
        return "The generated token is not among these bars."
    p, raw = pct(bars.probs[bars.chosen]), pct(bars.raw[bars.chosen])
    if req.temperature <= 0:
        how = ("took it with certainty, as the most likely token" if bars.chosen == 0 else
               "took the most likely token (a tie in the logits)")
        here = (f"{p} in these bars, {raw} in the plain softmax" if bars.greedy else
                f"at the sliders' settings it has p = {p} ({raw} in the plain softmax)")
        return f"The answer was generated greedily (temperature 0), which {how}: {here}."
    at = f"temperature {req.temperature:g}, top-k {req.top_k or 'off'}, top-p {req.top_p:g}"
    if (sampling.temperature, sampling.top_k, sampling.top_p) == (req.temperature, req.top_k, req.top_p):
        return f"The answer was sampled at these settings ({at}): the chosen token (orange) has p = {p}."
    return (f"The chosen token (orange) has p = {p} in these bars; the answer was sampled at {at}, where it had "
            f"p = {pct(token.prob)}.")


def distribution_section(run: Run, index: int, sampling: Sampling, decode: Callable[[list[int]], str]) -> None:
    token = run.tokens[index]
    bars = candidates(token, sampling, decode)
    name = "greedy (temperature 0)" if bars.greedy else f"temperature {sampling.temperature:g}"
    plot(charts.distribution_figure(bars.labels, bars.probs, bars.chosen, None if bars.plain else bars.raw, name),
         key=f"journey.dist.{run.id}.{index}")
    st.caption(distribution_caption(run, token, bars, sampling))


def lens_section(run: Run, index: int, decode: Callable[[list[int]], str], lm: ModelClient | None = None) -> None:
    captures, why = token_views(run, index, lm)
    if not any(c.lens for c in captures.values()):
        st.info(why or "Nothing was captured for this token (capture was off for this run).")
        return
    token = run.tokens[index]
    left, right = st.columns([3, 2])
    with left:
        plot(charts.lens_figure(captures, decode, token.id), key=f"journey.lens.{run.id}.{index}")
    with right:
        plot(charts.resid_norm_figure(captures), key=f"journey.norm.{run.id}.{index}")
    shown = sorted(i for i, c in captures.items() if c.lens)
    some = "" if len(shown) >= run.spec.n_layers else (
        f" This run kept the residual leaving {len(shown)} of {run.spec.n_layers} layers (its capture budget), so "
        "those are the layers shown.")
    st.caption("Left: what the model would predict if it stopped after each layer (the residual stream sent "
               "through the final norm and the LM head), top 5, the generated token in bold. Right: the size of "
               "the residual stream leaving each layer at that position." + some)


LENS_CACHE, LENS_CACHED = "journey.lens_views", 64


def token_views(run: Run, index: int, lm: ModelClient | None) -> tuple[dict, str | None]:
    """The lens and residual norms of the pass that produced token `index`: from the run's records (a recording),
    else derived on the model server from the residual the run kept (kept in the session); and why there are none."""
    captures = run.captures(index)
    pending = any(c.resid is not None and c.lens is None for c in captures.values())
    here = lm is not None and lm.label == run.model
    if pending and here:
        fill_lens(lm, captures)                            # only for the token you look at; kept in the run
    if captures or not (here and run.policy.enabled):
        return captures, ("The logit lens of this recording is computed by the model that made it; load that model "
                          "to see it." if pending else None)
    store = st.session_state.setdefault(LENS_CACHE, {})
    key = (run.id, index)
    if key not in store:
        try:
            view = lm.quick("run.lens", {"run_id": run.id, "position": run.n_prompt - 1 + index,
                                         "top": LOGIT_LENS_TOP})
        except EngineError as err:
            return {}, f"The logit lens could not be derived on the model server: {err}"
        while len(store) >= LENS_CACHED:
            store.pop(next(iter(store)))
        store[key] = view.captures()
    return store[key], None


def fill_lens(lm: ModelClient, captures: dict) -> None:
    """The logit lens of the layers that kept their residual, computed where the model is (two weight reads)."""
    resid = {i: c.resid for i, c in captures.items() if c.resid is not None and c.lens is None}
    try:
        lens = lm.quick("lens", {"resid": resid, "top": LOGIT_LENS_TOP})
    except EngineError as err:
        st.warning(f"The logit lens could not be computed: {err}")
        return
    for i, top in lens.items():
        captures[i].lens = top


OBSERVER = "journey.observer"
OBSERVER_TOKENS = 16          # decode steps per run of the measurement


def observer_section(lm: ModelClient, run: Run) -> None:
    """The same request decoded with capture off and on, alternating three times, on this server (measured)."""
    policy = run.policy if run.policy.enabled else capture_policy(lm.spec, run.n_prompt, OBSERVER_TOKENS)[0]
    request = replace(run.request, max_new_tokens=OBSERVER_TOKENS)
    if st.button("Measure capture off against on", key="journey.observer.measure"):
        with st.status("Measuring the observer effect…", expanded=True) as box:
            try:
                st.session_state[OBSERVER] = run_on_model(lm, "observer.effect",
                                                          {"request": request, "policy": policy, "rounds": 3},
                                                          status_progress(box))
                box.update(label="Measured", state="complete", expanded=False)
            except EngineError as err:
                box.update(label="Stopped", state="error")
                st.error(str(err))
    effect = st.session_state.get(OBSERVER)
    if effect is None:
        return
    plot(charts.observer_figure(effect.off.itl, effect.on.itl), key="journey.observer")
    st.caption(observer_caption(effect, kept_words(policy, run.spec.n_layers)))


def kept_words(policy: CapturePolicy, n_layers: int) -> str:
    """What a run with this policy keeps during its steps, in words."""
    inputs = policy.inputs
    return ("the residual stream entering every layer" if inputs is None else
            f"the residual stream entering {len(inputs)} of {n_layers} layers")


def observer_caption(effect: ObserverEffect, kept: str) -> str:
    """What the observer measurement found, every number from it: the two medians, their ratio, and whether their
    difference stands out from the spread between rounds of one setting."""
    off, on, noise = (fmt_ms(x) for x in (effect.off.itl, effect.on.itl, effect.noise))
    diff = fmt_ms(abs(effect.on.itl - effect.off.itl))
    text = (f"Measured on this server: one decode step took {off} with capture off and {on} with capture on "
            f"({effect.ratio:.2f}× as long; medians of {len(effect.on.steps)} steps each way, "
            f"{len(effect.rounds) or 'several'} rounds alternating). ")
    why = (f"During the steps the run keeps only {kept}, written in place like the KV cache; the attention maps, "
           "norms and logit lens are computed from it afterwards, when a page asks for them.")
    if effect.within_noise:
        text += (f"The difference, {diff}, is within the spread between rounds of the same setting ({noise}): "
                 f"watching is nearly free here. {why}")
    elif effect.on.itl > effect.off.itl:
        text += (f"Capture costs {diff} a step, more than the spread between rounds of the same setting ({noise}). "
                 f"{why} Writing that copy is the cost.")
    else:
        text += (f"Capture on came out {diff} faster, more than the spread between rounds ({noise}): the machine's "
                 "load changed during the measurement; measure again.")
    return text + (" The tokens were the same both ways: watching changes the speed, never the answer."
                   if effect.same_tokens else " The tokens differed: a near-tie in the logits tipped the other way.")


def run_up_close(lm: ModelClient | None, run: Run, sampling: Sampling) -> None:
    """Sections 4 and 5 of the journey page, for a finished run: one token up close, the observer effect."""
    st.subheader("4. One token up close")
    index = token_picker(run)
    decode = decoder(run, lm)
    st.markdown("**Its candidates.** Move the temperature, top-k and top-p controls above: the distribution is "
                "re-drawn from the stored logits.")
    distribution_section(run, index, sampling, decode)
    st.markdown("**Through the layers.**")
    lens_section(run, index, decode, lm)
    with st.container(horizontal=True):              # the run's two downloads side by side
        save_button(run, "journey", lm)
        notebook_button(run, lm, "journey")
    if lm is not None and lm.label == run.model:
        st.subheader("5. The observer effect")
        st.write("Does watching the model slow it down? The same request decoded with capture off and with capture "
                 "on, timed here:")
        observer_section(lm, run)
