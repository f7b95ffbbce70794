"""Sections of the speculative-decoding page: draft, k and sampling controls, the prompt with presets,
the live round-by-round timeline, acceptance, the measured speedup with the expectation beside it,
and the projection for Llama 3.2 1B drafting for Llama 3.1 8B on an H100.
"""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.runs.request import Sampling, new_token_limit, sanitize_settings
from app.ui.format import fmt_ms
from app.runs.run import Draft, Run, Throttle
from app.speculative import figures as charts
from engine.speculative.options import is_model_spec
from app.speculative.numbers import K_RANGE, PRESETS, Measured, measure, projected_pair
from app.ui.format import efficiency_note
from app.runs.widgets import ChartSlot, plot
from engine.errors import EngineError
from engine.service.client import ModelClient
from engine.speculative.decode import best_k, expected_speedup, expected_tokens_per_pass, speedup_curve

NS = "speculative"
KINDS = {"ngram": "N-gram prompt lookup", "early-exit": "Early exit (the model's own first layers)",
         "model": "A separate draft model"}
MAX_ROWS = 80                        # timeline rows drawn (the latest rounds)
DEFAULT_PRESET = "Copy a passage"


# --- controls -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftChoice:
    kind: str                        # a key of KINDS
    depth: int = 0                   # early exit: layers kept
    model: str | None = None         # draft model: an extra's key or a folder

    @property
    def spec_text(self) -> str:
        """What engine.speculative.decode.draft_from_spec reads."""
        if self.kind == "early-exit":
            return f"early-exit:{self.depth}"
        return self.model if self.kind == "model" and self.model else "ngram"


def _launched_defaults(lm: ModelClient) -> tuple[str, int]:
    """Draft kind and early-exit depth to start from, following the launcher's --draft when it names one."""
    n_layers = lm.spec.n_layers
    launched, depth = lm.launched_draft, max(1, n_layers // 3)
    if launched is None or launched.startswith("ngram"):
        return "ngram", depth
    if is_model_spec(launched):
        return "model", depth
    _, _, value = launched.replace("_", "-").partition(":")
    return "early-exit", min(int(value), n_layers - 1) if value.strip().isdigit() else depth


def draft_controls(lm: ModelClient) -> DraftChoice | None:
    """Draft kind and its setting; None (with the reason on screen) when the choice cannot run."""
    n_layers = lm.spec.n_layers
    kinds = [k for k in KINDS if k != "early-exit" or n_layers >= 2]
    default, depth = _launched_defaults(lm)
    kind = st.segmented_control("Draft", kinds, format_func=KINDS.get, default=default if default in kinds else "ngram",
                                key=f"{NS}.draft", required=True) or "ngram"
    if kind == "ngram":
        st.caption("Looks up the last few tokens (up to 3) earlier in the prompt and answer, and proposes what "
                   "followed them there. No model at all: drafting is almost free, and it is right when the answer "
                   "repeats text it has seen.")
        return DraftChoice("ngram")
    if kind == "early-exit":
        depth = st.slider("Early-exit depth (layers the draft runs)", 1, n_layers - 1, min(depth, n_layers - 1),
                          key=f"{NS}.depth", help=f"The draft is the first N of the model's {n_layers} layers, then "
                                                  "its final norm and LM head.")
        st.caption(f"Self-speculation: the first {depth} of {n_layers} layers, then the final norm and LM head, "
                   "propose each token; the full model checks them. This model was not trained to exit early.")
        return DraftChoice("early-exit", depth=depth)
    return _model_choice(lm)


def _model_choice(lm: ModelClient) -> DraftChoice | None:
    options = lm.draft_options()
    usable = [o for o in options if o.usable]
    for o in options:
        if not o.usable:
            st.caption(f"Not offered: {o.reason}.")
    if not usable:
        st.info(f"No installed model can draft for {lm.label}. Drafting needs a smaller model with the same "
                "tokenizer: start the playground with `--model qwen-1.5b` to use the Qwen2.5-Coder pair (0.5B drafts "
                "for 1.5B; `make models` installs it), or name a draft folder with `--draft` (PLAYGROUND_DRAFT).")
        return None
    labels = {o.name: o.label for o in usable}
    name = st.selectbox("Draft model", list(labels), format_func=labels.get, key=f"{NS}.model")
    st.caption("The draft runs its own forward pass per drafted token, with its own KV cache, rolled back with "
               "the target's after each check. It is loaded once, on the first Generate.")
    return DraftChoice("model", model=name)


def _set_prompt(text: str) -> None:
    st.session_state[f"{NS}.prompt"] = text


def prompt_controls() -> str:
    """Three preset buttons above the prompt box: code to continue, a passage to copy, an open question."""
    if f"{NS}.prompt" not in st.session_state:
        _set_prompt(PRESETS[DEFAULT_PRESET])
    row = st.container(horizontal=True)              # buttons as wide as their words, at any screen width
    for i, (name, text) in enumerate(PRESETS.items()):
        row.button(name, key=f"{NS}.preset.{i}", on_click=_set_prompt, args=(text,))
    return st.text_area("Prompt", height=100, key=f"{NS}.prompt",
                        help="Wrapped in the chat template before tokenizing (for instruct models).")


def run_controls(lm: ModelClient) -> tuple[int, Sampling]:
    """k, temperature, seed and max new tokens; the token limit is this server's (a stored value above it is
    put back in range, with a word)."""
    limit = new_token_limit(lm)
    for message in sanitize_settings(NS, limit):
        st.warning(message)
    cols = st.columns(4)
    k = cols[0].slider("k (tokens drafted per round)", K_RANGE[0], K_RANGE[-1], 4, key=f"{NS}.k")
    temperature = cols[1].slider("Temperature", 0.0, 1.5, 0.0, 0.05, key=f"{NS}.temperature",
                                 help="0: greedy, drafts are accepted when they equal the target's argmax. Above 0: "
                                      "rejection sampling, which keeps the target's distribution exactly.")
    seed = cols[2].number_input("Seed", 0, 2**31 - 1, 0, 1, key=f"{NS}.seed")
    max_new = cols[3].number_input("Max new tokens", 1, limit, min(64, limit), 1, key=f"{NS}.max_new",
                                   help=f"This server allows at most {limit:,}.")
    return int(k), Sampling(float(temperature), 0, 1.0, int(seed), int(max_new))


# --- running ------------------------------------------------------------------------------------------------

def build_draft(lm: ModelClient, choice: DraftChoice) -> Draft | None:
    """The draft for the choice, loaded where the model is (a draft model once per server); None after an error."""
    try:
        with st.spinner(f"Loading the draft {choice.spec_text} (first use only)…"):
            label = lm.load_draft(choice.spec_text)
    except EngineError as err:
        st.error(str(err))
        return None
    return Draft(choice.spec_text, label, choice.kind)


def last_speculative(run: Run | None) -> Run | None:
    """The session's run when it was speculative (a plain run from another page has no rounds to draw)."""
    return run if run is not None and run.speculation is not None else None


# --- the timeline -------------------------------------------------------------------------------------------

def status_line(run: Run) -> str:
    spec = run.speculation
    base = spec.baseline
    if run.live:
        return f"Speculative decoding with {spec.draft}, k = {spec.k}: round {len(spec.rounds)}…"
    if base is not None and base.live:
        return f"Now plain decoding of the same prompt, for the comparison: {len(base.steps) + 1} tokens…"
    if run.status == "stopped" or base is None or base.done is None:
        return (f"Stopped after {len(spec.rounds)} rounds ({len(run.tokens)} tokens); no comparison with plain "
                "decoding for a stopped run.")
    return (f"Done: {token_count(run)} with {spec.draft}, k = {spec.k}; then the same prompt with plain decoding "
            f"({base.done.generated_tokens} tokens).")


def token_count(run: Run) -> str:
    """How a speculative run's tokens came: '62 tokens: 1 from the prefill, 61 from 14 rounds' (each round is one
    verify pass of the model). The other figures of the page (tokens per pass, target passes) divide these."""
    rounds = run.speculation.rounds
    later = sum(len(r.emitted) for r in rounds)
    total = len(run.tokens)
    return (f"{total:,} tokens: {total - later:,} from the prefill, {later:,} from {len(rounds):,} "
            f"round{'s' * (len(rounds) != 1)}")


class TimelineView:
    """The status line, the answer, and one row per round, redrawn while the answer streams."""

    def __init__(self) -> None:
        self.status = st.empty()
        self.answer = st.empty()
        self.note: DeltaGenerator | None = None
        self.chart: ChartSlot | None = None
        self.text_throttle, self.chart_throttle = Throttle(0.1), Throttle(0.4)

    def chart_slot(self) -> None:
        """Where the rounds' chart goes (under the section's heading, below the answer)."""
        self.note = st.empty()
        self.chart = ChartSlot(f"{NS}.timeline")

    def update(self, run: Run, final: bool = False) -> None:
        spec = run.speculation
        if spec.baseline is not None and not final:          # the plain decoding after it: the status line only
            if self.text_throttle() or spec.baseline.done is not None:
                self.status.caption(status_line(run))
            return
        if not (final or self.text_throttle()):
            return
        self.status.caption(status_line(run))
        self.answer.text(run.text or "…")
        if spec.rounds and self.chart is not None and (final or self.chart_throttle()):
            shown = spec.rounds[-MAX_ROWS:]
            if len(shown) < len(spec.rounds):
                self.note.caption(f"The latest {len(shown)} of {len(spec.rounds)} rounds.")
            self.chart.plot(charts.timeline_figure(shown, spec.k))


# --- acceptance -------------------------------------------------------------------------------------------

def acceptance_section(run: Run, m: Measured) -> None:
    cols = st.columns(4)
    cols[0].metric("Acceptance rate a", pct(m.a), help="Drafts the model accepted / drafts it judged.")
    cols[1].metric("Drafts kept", pct(m.acceptance_rate), help="Drafts that ended up in the answer / all drafts.")
    cols[2].metric("Tokens per verify pass", f"{m.tokens_per_pass:.2f}",
                   help=f"{m.spec_tokens} tokens after the first / {m.rounds} verify passes (plain decoding: 1).")
    cols[3].metric("Target passes", f"{m.rounds + 1:,}", help=f"1 prefill + {m.rounds} verify passes for "
                                                             f"{len(run.tokens)} tokens (plain decoding: {len(run.tokens)}).")
    st.caption(f"{token_count(run)}, one verify pass each: {m.spec_tokens} / {m.rounds} = {m.tokens_per_pass:.2f} "
               f"tokens per verify pass, and {m.rounds + 1} passes of the model in all with the prefill, where plain "
               f"decoding needs {len(run.tokens)}.")
    st.caption(f"Two shares, two questions. The **acceptance rate a** ({pct(m.a)}) asks how often the model agreed "
               "with a draft it judged: it judges a round's drafts in order and stops at the first it rejects. The "
               f"drafts after that are thrown away unjudged, so **drafts kept** ({pct(m.acceptance_rate)}) is lower: "
               "every drafted token counts there. a is the rate the formulas below use.")
    if m.by_position:
        plot(charts.position_figure(m.by_position, m.a), key=f"{NS}.positions.{run.id}")
        st.caption(f"Bars: the share of rounds whose draft at position j was accepted. A draft at position j passes "
                   f"only when all before it passed, so if every draft passed independently at rate a = {pct(m.a)} "
                   f"the bars would follow a^j (dotted). {position_reading(m.by_position, m.a)}"
                   f"{_short_rounds_note(run, m)}")


def pct(x: float) -> str:
    """A share written one way everywhere on the page: 0.963 -> '96%'."""
    return f"{x:.0%}"


def pass_rates(by_position: list[float]) -> list[float]:
    """Each draft position's pass rate given that the one before it passed, from the bars (accepted / drafted at
    position j): the first bar, then each bar over the one before it (up to the first bar at 0)."""
    rates = by_position[:1]
    for before, share in zip(by_position, by_position[1:]):
        if before <= 0:
            break
        rates.append(min(1.0, share / before))
    return rates


def position_reading(by_position: list[float], a: float) -> str:
    """What this run's bars say against a^j, read from the bars themselves: whether a draft passes more often (runs),
    less often, or as often once the one before it passed as draft 1 does."""
    rates = pass_rates(by_position)
    bars = f"The bars go from {pct(by_position[0])} to {pct(by_position[-1])}"
    line = f"the dotted line from {pct(a)} to {pct(a ** len(by_position))}"
    if len(rates) < 2:
        return f"Here only position 1 was drafted ({pct(by_position[0])} passed)."
    first, later = rates[0], rates[1:]
    given = (f"Draft 1 passed in {pct(first)} of rounds; each later draft, once the one before it had passed, in "
             f"{', '.join(pct(r) for r in later)}.")
    above, below = sum(r > first + 0.02 for r in later), sum(r < first - 0.02 for r in later)
    if above > below:
        return (f"{given} {bars}, {line}: acceptances come in runs (when the draft is right once, as when it copies "
                "a passage, it tends to stay right), so the bars fall more slowly than a^j.")
    if below > above:
        return (f"{given} {bars}, {line}: the draft's later guesses fail more often than its first ones, so the bars "
                "fall faster than a^j and a long draft pays less than a suggests.")
    return f"{given} {bars}, {line}: each draft passed about as often as the first, as a^j assumes."


def _short_rounds_note(run: Run, m: Measured) -> str:
    if not m.short_rounds:
        return ""
    why = ("the lookup found no earlier match" if run.speculation.draft_kind == "ngram" else "the answer was nearly done")
    return (f" {m.short_rounds} of {m.rounds} rounds drafted fewer than k = {m.k} tokens ({why}); each such round "
            f"is closer to a plain decoding step.")


# --- speed ----------------------------------------------------------------------------------------------------

def speed_section(run: Run, m: Measured) -> None:
    if m.plain_step is None:
        st.caption("The plain decoding of the same prompt did not run (the run was stopped), so there is no "
                   "measured speedup.")
        return
    cols = st.columns(4)
    cols[0].metric("Decode speedup (measured)", f"{m.speedup:.2f}×" if m.speedup else "–",
                   help="Plain decoding's time per token / speculative decoding's time per token, after the first "
                        "token (prefill is the same in both).")
    cols[1].metric("Speculative", f"{m.spec_decode:.2f} s", help=f"{m.spec_tokens} tokens after the first: every "
                                                                  "round's drafting plus verifying.")
    cols[2].metric("Plain decoding", f"{m.plain_decode:.2f} s", help=f"{m.plain_tokens} tokens after the first, one "
                                                                     "target pass each.")
    cols[3].metric("Same text as plain decoding", {True: "yes", False: "no", None: "–"}[m.same_text],
                   help="At temperature 0 it must be identical. When sampling, both runs draw from the same "
                        "distribution but not the same random numbers.")
    st.markdown("**Where each round's time went**")
    plot(charts.round_time_figure(run.speculation.rounds, m.plain_step), key=f"{NS}.round_time.{run.id}")
    st.caption(f"Stacked bars: drafting and verifying, per round. Black ticks: what plain decoding spent on the same "
               f"number of tokens ({fmt_ms(m.plain_step)} per step, measured right after). A round below its tick "
               "won time.")


def k_section(run: Run, m: Measured) -> None:
    """Tokens per pass and speedup against k: the formula with the measured a, the measured point, and the
    same a with this run's measured costs and with the projected H100 costs."""
    ks = list(K_RANGE)
    pair = projected_pair()
    curves = []
    if m.cost_ratio is not None and m.check_ratio is not None:
        curves.append((f"measured costs: c = {share(m.cost_ratio)}, u = {share(m.check_ratio)}",
                       speedup_curve(m.a, m.cost_ratio, ks, m.check_ratio), charts.MEASURED_COLOR, "solid"))
    curves.append((f"projected: {pair.draft} → {pair.target} on {pair.gpu}, c = {share(pair.cost_ratio)}, u = 0%",
                   speedup_curve(m.a, pair.cost_ratio, ks), charts.PROJECTED_COLOR, "dash"))
    expected = [expected_tokens_per_pass(m.a, k) for k in ks]
    plot(charts.k_figure(ks, expected, m.k, m.tokens_per_pass, curves, m.speedup), key=f"{NS}.k.{run.id}")
    st.caption(f"Left: (1 − a^(k+1)) / (1 − a) with the measured a = {pct(m.a)}: {m.expected_at_k:.2f} tokens per pass "
               f"at k = {m.k}, measured {m.tokens_per_pass:.2f}. Right: speedup(k) = E[tokens per pass] / "
               "(1 + k·(c + u)): "
               "a round drafts k tokens at c each and checks them in one target pass that costs a plain step plus u "
               "per drafted token, c and u as shares of one plain target step; the diamond is the measured decode "
               "speedup. The projected line takes u = 0%: on a GPU a decode step is bound by reading the weights, so "
               "checking a few more tokens in the same pass costs almost nothing.")
    if m.cost_ratio is not None and m.check_ratio is not None and m.speedup is not None:
        st.caption(line_gap(m))
        st.markdown(verdict(run, m))


def line_gap(m: Measured) -> str:
    """Where the measured-cost line stands at the measured k against the measured point, and why they differ."""
    at_k = expected_speedup(m.a, m.k, m.cost_ratio, m.check_ratio)
    return (f"At k = {m.k} the measured-cost line gives {at_k:.2f}× and the run measured {m.speedup:.2f}×. The line "
            f"assumes every round drafts k tokens and that acceptances are independent ({m.expected_at_k:.2f} tokens "
            f"per pass expected, {m.tokens_per_pass:.2f} measured; {m.drafted_per_round:.1f} drafted per round), and "
            "it leaves out the first round, where a model draft reads the whole prompt.")


def share(x: float) -> str:
    """A cost ratio as a share of a target step: 0.43 -> '43%', 0.0021 -> '0.21%', 0.00002 -> 'under 0.01%'."""
    if x >= 0.1:
        return f"{x:.0%}"
    return f"{x:.2%}" if x >= 1e-4 else "under 0.01%"


def verdict(run: Run, m: Measured) -> str:
    """Why this draft helps or not here, from the measured costs."""
    c, v, d, tpp = m.cost_ratio, m.verify_ratio, m.drafted_per_round, m.tokens_per_pass
    cost = v + d * c
    lines = [f"Measured: a round cost {v:.2f} plain steps to verify ({fmt_ms(m.verify_per_round)} against "
             f"{fmt_ms(m.plain_step)} for one plain step, means) plus {d:.1f} drafted tokens at {share(c)} of a step "
             f"each ({fmt_ms(m.draft_per_token)} per token): {cost:.2f} steps for {tpp:.2f} tokens, so "
             f"{tpp / cost:.2f}× from the costs and {m.speedup:.2f}× measured.", noise_note(m)]
    if m.speedup >= 1.1:
        lines.append(f"This draft helps here: it costs {share(c)} of a target step per token and the target accepted "
                     f"enough (a = {pct(m.a)}) that each pass yields more than the round costs.")
    elif c >= 0.15:
        lines.append(f"Drafting is what makes it slow: one drafted token costs {share(c)} of a full target step, so "
                     f"the drafts alone cost {d * c:.2f} steps per round while the round gained only {tpp - 1:.2f} "
                     "tokens over plain decoding.")
        if run.speculation.draft_kind == "early-exit":
            lines.append("The early exit runs a good part of the layers and the whole LM head for every drafted "
                         "token, and this model was never trained to make its early layers predict; drafts trained "
                         "for it (EAGLE, Medusa, LayerSkip) are cheaper and right far more often.")
    else:
        lines.append(f"The draft is cheap ({share(c)} of a step per token) but too rarely right for this prompt "
                     f"(a = {pct(m.a)}): {tpp:.2f} tokens per pass barely pays for a verify pass.")
    if v > 1.15:
        lines.append(f"On this CPU a verify pass over k + 1 tokens costs {v:.2f} plain steps, since the arithmetic "
                     "grows with the tokens; on a GPU a decode step is bound by reading the weights, and checking a "
                     "few more tokens in the same pass costs almost nothing.")
    return " ".join(lines)


def noise_note(m: Measured) -> str:
    """How much the timings behind the verify cost varied within this run: a second run reads differently."""
    (v_lo, v_hi), plain = m.verify_range, m.plain_range
    text = (f"These are means of noisy timings: a verify pass took {fmt_ms(v_lo)} to {fmt_ms(v_hi)} over the "
            f"{m.steady_rounds} round{'s' * (m.steady_rounds != 1)} counted")
    if plain is not None:
        text += f", a plain step {fmt_ms(plain[0])} to {fmt_ms(plain[1])} over {m.plain_tokens}"
    return (text + ". On a CPU shared with the web app and the browsers a step waits whenever another program has "
            "its core, so the ratio moves from run to run; generate again to see by how much.")


# --- the projection -------------------------------------------------------------------------------------------

def projection_section(m: Measured) -> None:
    pair = projected_pair()
    k, speedup = best_k(m.a, pair.cost_ratio, K_RANGE)
    cols = st.columns(4)
    cols[0].metric(f"{pair.draft} decode step", fmt_ms(pair.draft_step_ms / 1e3))
    cols[1].metric(f"{pair.target} decode step", fmt_ms(pair.target_step_ms / 1e3))
    cols[2].metric("Draft / target step (c)", share(pair.cost_ratio))
    cols[3].metric(f"Speedup at a = {pct(m.a)}", f"{speedup:.2f}× at k = {k}",
                   help=f"E[tokens per pass] / (1 + k·c) with the projected c; at the measured k = {m.k}: "
                        f"{speedup_curve(m.a, pair.cost_ratio, range(m.k, m.k + 1))[0]:.2f}×.")
    st.caption(f"Projected, not measured: step times from the playground's cost model for one user on one {pair.gpu} "
               f"(BF16 weights, 1K tokens of context, {efficiency_note()}, as on every page); the acceptance "
               "a is the one measured here. A 1B Llama drafting for the 8B accepts at its own rate (70–90% on "
               "domain text is typical), so read this as what the costs do at this acceptance.")


def rounds_sections(run: Run) -> None:
    """The speculative page below the timeline, for a run with rounds: acceptance, speed, k, the projection."""
    st.caption("Each row is one round: the drafted tokens, green where the model agreed and red from its "
               "first disagreement on, then the model's own token (blue: its correction; violet: the bonus when "
               "every draft passed; grey: nothing was drafted, so the round was a plain step). Hover a cell for "
               "the draft's and the model's probability of that token.")
    m = measure(run)

    st.subheader("2. How often the draft is right")
    acceptance_section(run, m)

    st.subheader("3. Is it faster? Measured on this machine")
    speed_section(run, m)
    k_section(run, m)

    st.subheader("4. Projected: Llama 3.2 1B drafting for Llama 3.1 8B on an H100")
    projection_section(m)
