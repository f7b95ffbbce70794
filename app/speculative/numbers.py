"""The numbers the speculative page draws from a run's records: acceptance, what drafting and verifying
cost against a plain step, the measured speedup, and the projected pair (Llama 3.2 1B for 3.1 8B).

No Streamlit here. The run itself is an `app.runs.run.Run` with its `speculation` set; the expected speedup
is `engine.speculative.decode.expected_speedup`. Times compared are the engine's own per-record timings
(prefill, each round's draft and verify, each plain decode step), never wall time around the loop,
which would include the page redrawing charts.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.runs.run import Run
from engine.speculative.demo_prompts import SPECULATIVE_PROMPTS
from engine.projection.cost import project
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS
from engine.speculative.decode import SpecRoundRecord, expected_tokens_per_pass

K_RANGE = range(1, 9)                    # k offered on the page and drawn on the charts
PROJECTED_DRAFT, PROJECTED_TARGET, PROJECTED_GPU = "llama-3.2-1b", "llama-3.1-8b", "h100-sxm"

PRESETS = {   # the three prompts of bench/speculative.py, so the page's numbers compare with the README's
    "Code continuation": SPECULATIVE_PROMPTS["code"],
    "Copy a passage": SPECULATIVE_PROMPTS["copy"],
    "Open question": SPECULATIVE_PROMPTS["question"],
}


# --- what the records measure -----------------------------------------------------------------------------

def per_token_acceptance(rounds: list[SpecRoundRecord]) -> float:
    """a: accepted drafts / drafts the target checked (up to and including each round's first rejection).

    This is the per-token rate in (1 - a^(k+1)) / (1 - a). Accepted / drafted is lower: drafts after a
    rejection are thrown away without being judged on their own.
    """
    accepted = sum(r.accepted for r in rounds)
    checked = accepted + sum(1 for r in rounds if r.accepted < len(r.drafted))
    return accepted / checked if checked else 0.0


def steady_rounds(rounds: list[SpecRoundRecord]) -> list[SpecRoundRecord]:
    """The rounds the costs come from: all but the first when there are others (a model draft reads the whole
    prompt in round 1)."""
    return rounds[1:] if len(rounds) > 1 else rounds


def costs_from_rounds(rounds: list[SpecRoundRecord]) -> tuple[float, float, float]:
    """(draft seconds per drafted token, verify seconds per round, drafted tokens per round).

    Round 1 is left out when there are others: a model draft reads the whole prompt there first.
    """
    steady = steady_rounds(rounds)
    drafted = sum(len(r.drafted) for r in steady)
    draft = sum(r.draft_seconds for r in steady) / drafted if drafted else 0.0
    verify = sum(r.verify_seconds for r in steady) / len(steady) if steady else 0.0
    return draft, verify, drafted / len(steady) if steady else 0.0


@dataclass(frozen=True)
class Measured:
    """Everything the page reports about one finished run; times in seconds, ratios against a plain step."""

    k: int
    rounds: int
    drafted: int
    accepted: int
    acceptance_rate: float          # accepted / drafted
    a: float                        # per-token acceptance (see per_token_acceptance)
    by_position: list[float]        # accepted / drafted at draft position j+1
    tokens_per_pass: float          # tokens per verify pass (plain decoding: 1)
    expected_at_k: float            # (1 - a^(k+1)) / (1 - a)
    expected_drafted: float         # the same formula averaged over each round's actual draft length
    short_rounds: int               # rounds that drafted fewer than k tokens
    draft_per_token: float
    verify_per_round: float
    steady_drafted: float           # drafted tokens per round, over the rounds the two costs come from
    spec_decode: float              # every round's draft + verify
    spec_tokens: int                # tokens decoded after the first (which prefill gives both runs)
    plain_step: float | None        # mean plain decode step
    plain_decode: float | None
    plain_tokens: int | None
    speedup: float | None           # plain seconds per token / speculative seconds per token, decode only
    same_text: bool | None
    verify_range: tuple[float, float] = (0.0, 0.0)         # fastest and slowest verify pass, the steady rounds
    plain_range: tuple[float, float] | None = None         # fastest and slowest plain decode step
    steady_rounds: int = 0                                 # rounds the costs come from (all but the first)

    @property
    def cost_ratio(self) -> float | None:
        """c: one drafted token's cost as a share of one plain target step."""
        return self.draft_per_token / self.plain_step if self.plain_step else None

    @property
    def verify_ratio(self) -> float | None:
        """v: one verify pass over k+1 positions, in plain target steps."""
        return self.verify_per_round / self.plain_step if self.plain_step else None

    @property
    def check_ratio(self) -> float | None:
        """u: what checking one more drafted token adds to a verify pass, in plain target steps.

        The verify pass reads k + 1 positions where a plain step reads 1: v = 1 + k·u. On a GPU u is close to 0
        (the step reads the weights once either way); on a CPU the arithmetic grows with the positions."""
        if self.verify_ratio is None or not self.steady_drafted:
            return None
        return max(0.0, (self.verify_ratio - 1.0) / self.steady_drafted)

    @property
    def drafted_per_round(self) -> float:
        return self.drafted / self.rounds if self.rounds else 0.0


def measure(run: Run) -> Measured:
    """What a finished (or stopped) speculative run measured, against its plain baseline when that ran."""
    spec, done = run.speculation, run.done
    rounds, k = spec.rounds, spec.k
    plain = spec.baseline.done if spec.baseline is not None else None
    plain_steps = [s.seconds for s in spec.baseline.steps] if plain is not None else []
    a = per_token_acceptance(rounds)
    draft, verify, steady_drafted = costs_from_rounds(rounds)
    spec_decode = sum(r.draft_seconds + r.verify_seconds for r in rounds)
    spec_tokens = sum(len(r.emitted) for r in rounds)
    drafted = sum(len(r.drafted) for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    plain_decode = sum(plain_steps) if plain is not None else None
    plain_tokens = len(plain_steps) if plain is not None else None
    plain_step = plain_decode / plain_tokens if plain_tokens else None
    speedup = (plain_step / (spec_decode / spec_tokens)
               if plain_step and spec_tokens and spec_decode > 0 else None)
    return Measured(
        k=k, rounds=len(rounds), drafted=drafted, accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0, a=a,
        by_position=list(done.acceptance_by_position) if done else by_position(rounds),
        tokens_per_pass=spec_tokens / len(rounds) if rounds else 0.0,
        expected_at_k=expected_tokens_per_pass(a, k),
        expected_drafted=(sum(expected_tokens_per_pass(a, len(r.drafted)) for r in rounds) / len(rounds)
                          if rounds else 0.0),
        short_rounds=sum(1 for r in rounds if len(r.drafted) < k),
        draft_per_token=draft, verify_per_round=verify, steady_drafted=steady_drafted, spec_decode=spec_decode,
        spec_tokens=spec_tokens,
        plain_step=plain_step, plain_decode=plain_decode, plain_tokens=plain_tokens, speedup=speedup,
        same_text=(plain.text == done.text) if plain is not None and done is not None else None,
        verify_range=spread([r.verify_seconds for r in steady_rounds(rounds)]),
        plain_range=spread(plain_steps) if plain_steps else None, steady_rounds=len(steady_rounds(rounds)))


def spread(values: list[float]) -> tuple[float, float]:
    return (min(values), max(values)) if values else (0.0, 0.0)


def by_position(rounds: list[SpecRoundRecord]) -> list[float]:
    """accepted / drafted at each draft position, for a run that stopped before its summary."""
    drafted: list[int] = []
    accepted: list[int] = []
    for r in rounds:
        for j in range(len(r.drafted)):
            if j == len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[j] += 1
            accepted[j] += int(j < r.accepted)
    return [x / n for x, n in zip(accepted, drafted)]


@dataclass(frozen=True)
class ProjectedPair:
    draft: str
    target: str
    gpu: str
    draft_step_ms: float
    target_step_ms: float

    @property
    def cost_ratio(self) -> float:
        return self.draft_step_ms / self.target_step_ms


def projected_pair(draft: str = PROJECTED_DRAFT, target: str = PROJECTED_TARGET,
                   gpu: str = PROJECTED_GPU) -> ProjectedPair:
    """Decode step times of both models at batch 1 from engine.projection (bandwidth, weight and KV bytes)."""
    gpu_spec = GPU_PRESETS[gpu]
    d, t = project(MODEL_PRESETS[draft], gpu_spec), project(MODEL_PRESETS[target], gpu_spec)
    return ProjectedPair(MODEL_PRESETS[draft].name, MODEL_PRESETS[target].name, gpu_spec.name,
                         d.decode_step_ms, t.decode_step_ms)
