"""The kernel tuner's arithmetic, pure: what one call of a candidate costs (from a timed run and its energy meter's
window), which candidate wins under the job's objective against what the job would run untuned, whether tuning can
pay for itself over the rows a job has left, and the verdict of the A/B a job runs in its own shards.

Costs are per call (one batch through the model) in the objective's unit: milliseconds under `time`, joules above the
device's idle draw under `energy`, as a job's own energy is counted (farm.core.energy.marginal_joules).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum

from farm.core.energy import MARGINAL_FLOOR, METER_STEPS

# A winner must beat the baseline by this share on the objective: below it, the measurement's noise (a counter's
# step over 20 steps is 5 %) could have made the choice, and the baseline costs no build and no risk.
MARGIN = 0.05
# What a tuning run is expected to save per row before any candidate is measured: a prior, deliberately modest
# (the geomean of whole-model winners against PyTorch's defaults was ~1.2x on the H200, issue 29).
PRIOR_GAIN = 0.15
# The least budget that measures a candidate depends on the model's call (least_tuning_s): a run's start (saving and
# analysing the model, the idle draw, the evaluator's child: its CUDA context, the model, the reference's FLOPs),
# then eager, the job's untuned baseline and one candidate, each checked, timed and metered. On an H100 a job's run
# with a 20 s budget and a 93 ms call spent 28.6 s and 5,226 J measuring the reference alone (2026-12-06, before
# the rounds shared one child); after, runs of that model spent 8.4 s and 13.4 s outside their candidates (saving,
# analysis, the idle draw, the evaluator's start), and 5.0-7.2 s measuring each (docs/h100-2026-12-06-d.md).
TUNING_START_S = 12.0
# Calls a measurement makes: 3 checked calls and their 3 references, 3 warm-up, 20 timed, 1 more reference
# (farm_agent.tuner.worker); its energy run lasts METER_STEPS of the meter's steps (NVML's: 100 ms), a call at least.
CALLS_PER_MEASUREMENT = 30
METER_WINDOW_S = METER_STEPS * 0.1
MEASURED_FIRST = 3  # eager, the untuned baseline and one candidate


def least_tuning_s(call_s: float) -> float:
    """The least budget in which a tuning run of a model whose call (one batch) takes `call_s` measures a candidate;
    below it no run is made."""
    return TUNING_START_S + MEASURED_FIRST * (CALLS_PER_MEASUREMENT * call_s + max(METER_WINDOW_S, call_s))


class Objective(StrEnum):
    ENERGY = "energy"  # joules per call above idle: the `efficiency` policy (the default)
    TIME = "time"  # milliseconds per call: `throughput` and `deadline`


def objective_for(policy: str) -> Objective:
    """The objective a job's placement policy asks the tuner for."""
    return Objective.ENERGY if policy == "efficiency" else Objective.TIME


@dataclass(frozen=True)
class CallCost:
    """One call of a candidate: its time, and its energy above idle where a counter measured it."""

    ms: float
    joules: float | None = None

    def on(self, objective: Objective) -> float | None:
        return self.ms if objective is Objective.TIME else self.joules


def calls_for_meter(call_ms: float, step_s: float, steps: int = METER_STEPS) -> int:
    """How many back-to-back calls fill `steps` of the meter's steps: shorter windows measure the meter's step, not
    the work (farm.core.energy.METER_STEPS)."""
    if call_ms <= 0 or step_s <= 0:
        return 1
    return max(1, math.ceil(steps * step_s * 1e3 / call_ms))


def call_cost(calls: int, seconds: float, joules: float | None, idle_w: float | None) -> CallCost:
    """The cost of one call from a window of `calls` back-to-back calls that lasted `seconds` and read `joules`:
    the energy above `idle_w` over the window (floored at MARGINAL_FLOOR of it, as a shard's marginal energy is),
    shared among the calls. Without an idle figure the whole draw counts."""
    if calls < 1 or seconds <= 0:
        raise ValueError("a cost needs at least one call over a positive time")
    if joules is None:
        return CallCost(ms=seconds * 1e3 / calls)
    above = joules if idle_w is None else max(joules - idle_w * seconds, MARGINAL_FLOOR * joules)
    return CallCost(ms=seconds * 1e3 / calls, joules=above / calls)


def rank_key(objective: Objective) -> str:
    """The objective's unit, for reports."""
    return "J/call" if objective is Objective.ENERGY else "ms/call"


def effective_objective(costs: Mapping[str, CallCost], baseline: str, objective: Objective) -> Objective:
    """Energy ranks only where the baseline's energy was measured (no counter: no joules): else time does."""
    if objective is Objective.ENERGY and costs[baseline].joules is None:
        return Objective.TIME
    return objective


def pick(costs: Mapping[str, CallCost], baseline: str, objective: Objective, margin: float = MARGIN) -> str:
    """The candidate (of those measured correct: `costs`) with the lowest cost on the objective, if it beats the
    baseline by `margin`; else the baseline. A candidate without a figure on the objective is not ranked."""
    if baseline not in costs:
        raise ValueError(f"the baseline {baseline!r} was not measured")
    objective = effective_objective(costs, baseline, objective)
    base = costs[baseline].on(objective)
    if base is None:
        return baseline
    ranked = sorted((value, name) for name, cost in costs.items() if (value := cost.on(objective)) is not None)
    best_value, best = ranked[0]
    return best if best_value < base * (1.0 - margin) else baseline


def speedup(costs: Mapping[str, CallCost], baseline: str, winner: str, objective: Objective) -> float | None:
    """How many times cheaper the winner is than the baseline on the objective."""
    base, won = costs[baseline].on(objective), costs[winner].on(objective)
    return base / won if base is not None and won else None


@dataclass(frozen=True)
class TuningPlan:
    """Whether to tune, within what budget, and why, in words for `farm job --explain`."""

    tune: bool
    budget_s: float
    reason: str


def plan_tuning(*, budget_s: float, rows_left: int, baseline_per_row: float, tuning_per_s: float,
                objective: Objective, least_s: float, cached: bool = False, gain: float = PRIOR_GAIN) -> TuningPlan:
    """Tune only where the expected saving exceeds the expected cost: the saving is rows_left x baseline_per_row x
    gain (the prior share a winner saves), the cost is what the device spends per second of tuning (`tuning_per_s`:
    1 s/s under time, its watts above idle under energy) times the budget. So the budget is capped at the saving's
    worth of tuning seconds; a cached winner costs nothing and needs no budget. Under `least_s` (least_tuning_s of the
    model's call), asked or capped, a run would measure no candidate: none is made."""
    unit = "J" if objective is Objective.ENERGY else "s"
    if cached:
        return TuningPlan(False, 0.0, "a cached winner for this GPU, model, shapes, tolerance and objective")
    if budget_s <= 0 or rows_left <= 0 or baseline_per_row <= 0 or tuning_per_s <= 0:
        return TuningPlan(False, 0.0, "nothing to save: no budget, no rows left or no measured cost")
    saving = rows_left * baseline_per_row * gain
    cap = saving / tuning_per_s
    if cap < least_s:
        return TuningPlan(False, 0.0, f"not worth it: {rows_left} rows could save ~{saving:.3g} {unit} "
                                      f"({gain:.0%} of their cost), less than {least_s:.0f} s of tuning costs, "
                                      "the least that measures a candidate of this model")
    capped = min(budget_s, cap)
    why = f"{rows_left} rows could save ~{saving:.3g} {unit} ({gain:.0%} of their cost)"
    if budget_s < least_s:
        return TuningPlan(False, 0.0, f"not worth it: {why}, but a budget of {budget_s:g} s measures no candidate "
                                      f"(the least that does for this model is {least_s:.0f} s)")
    if capped < budget_s:
        why += f"; budget capped from {budget_s:g} s to {capped:.0f} s by that saving"
    return TuningPlan(True, capped, why)


def break_even_rows(tuning_cost: float, baseline_per_row: float, winner_per_row: float) -> float | None:
    """The rows after which the winner has paid back its tuning (same unit for all three); None if it never does."""
    saving = baseline_per_row - winner_per_row
    return tuning_cost / saving if saving > 0 else None


@dataclass(frozen=True)
class ShardRate:
    """One shard's measured cost per row, under the forward it ran."""

    rows: int
    seconds: float
    joules: float | None  # above idle, or None without a counter

    def per_row(self, objective: Objective) -> float | None:
        if self.rows <= 0:
            return None
        value = self.seconds if objective is Objective.TIME else self.joules
        return value / self.rows if value is not None else None


def keep_winner(eager: ShardRate, winner: ShardRate, objective: Objective) -> bool:
    """The in-job A/B: the winner stays only if its shard is no slower per row than the eager shard and, under
    `energy`, spends no more joules per row either (a winner that saves time but not joules is no gain there);
    without a counter, time alone decides."""
    eager_s, winner_s = eager.per_row(Objective.TIME), winner.per_row(Objective.TIME)
    if eager_s is None or winner_s is None or winner_s > eager_s:
        return False
    eager_j, winner_j = eager.per_row(Objective.ENERGY), winner.per_row(Objective.ENERGY)
    return objective is Objective.TIME or eager_j is None or winner_j is None or winner_j <= eager_j


# --- the in-job A/B: the job's first shards run eager, the next ones the winner, per device ----------------------

# Each side of the A/B needs this many items measured before its verdict (or AB_SHARE of the job's, if fewer): a
# shard's rate over fewer rows is mostly its start.
AB_MIN_ITEMS = 4096
AB_SHARE = 0.1


def ab_min_items(job_items: int) -> int:
    """Items each side of a job's A/B needs measured before the verdict."""
    return max(1, min(AB_MIN_ITEMS, math.ceil(job_items * AB_SHARE)))


def _plus(a: ShardRate, b: ShardRate) -> ShardRate:
    joules = a.joules + b.joules if a.joules is not None and b.joules is not None else None
    return ShardRate(a.rows + b.rows, a.seconds + b.seconds, joules)


class AbState(StrEnum):
    EAGER_FIRST = "measuring eager"  # the untuned side has too few items yet: the next shard runs eager
    TRYING = "trying the winner"  # the winner's side has too few items yet: the next shard runs the winner
    KEPT = "kept"  # the winner won in the job's own shards: it runs the rest
    REVERTED = "reverted"  # the winner lost: eager runs the rest


@dataclass(frozen=True)
class AbShard:
    """One finished shard of the A/B: the forward it ran ("" the untuned model) and its measured figures."""

    winner: str
    rate: ShardRate


@dataclass(frozen=True)
class AbVerdict:
    state: AbState
    eager: ShardRate  # the eager side's shards, summed (up to the verdict)
    tuned: ShardRate  # the winner's
    winner: str = ""

    @property
    def runs_winner(self) -> bool:
        """Whether the device's next shard runs the winner."""
        return self.state in (AbState.TRYING, AbState.KEPT)

    def gain(self, objective: Objective) -> float | None:
        """How many times cheaper per item the winner was than eager on the objective: its speed-up under `time`,
        its items per joule above idle over eager's under `energy`."""
        eager, tuned = self.eager.per_row(objective), self.tuned.per_row(objective)
        return eager / tuned if eager is not None and tuned else None


def ab_verdict(shards: Sequence[AbShard], objective: Objective, min_items: int) -> AbVerdict:
    """The A/B on one device from its finished shards in the order they were cut: each shard counts to the side of
    the forward it ran; once both sides hold `min_items`, the verdict is taken (keep_winner) and later shards do not
    change it, so a reverted job stays eager. Before that, eager is measured first, then the winner."""
    eager = tuned = ShardRate(0, 0.0, 0.0)
    winner = ""
    for shard in shards:
        if shard.winner:
            tuned, winner = _plus(tuned, shard.rate), shard.winner
        else:
            eager = _plus(eager, shard.rate)
        if eager.rows >= min_items and tuned.rows >= min_items:
            state = AbState.KEPT if keep_winner(eager, tuned, objective) else AbState.REVERTED
            return AbVerdict(state, eager, tuned, winner)
    return AbVerdict(AbState.EAGER_FIRST if eager.rows < min_items else AbState.TRYING, eager, tuned, winner)


def paid_off_items(verdict: AbVerdict, tuning_s: float, tuning_j: float | None, objective: Objective
                   ) -> float | None:
    """The item count at which the winner paid back its tuning in the job's own shards, on the objective (its joules
    above idle under `energy` where measured, else its seconds); None if it never does (it saves nothing)."""
    use_j = objective is Objective.ENERGY and tuning_j is not None
    unit = Objective.ENERGY if use_j else Objective.TIME
    eager, tuned = verdict.eager.per_row(unit), verdict.tuned.per_row(unit)
    if eager is None or tuned is None:
        return None
    return break_even_rows(tuning_j if use_j and tuning_j is not None else tuning_s, eager, tuned)


# --- what a shard's node says of its forward, and the winners shared across the farm -----------------------------

Param = str | int | float | bool
NAME = re.compile(r"[a-z0-9][a-z0-9._:+-]{0,63}")  # a candidate's or a parameter's name
MAX_PARAMS = 16
MAX_TEXT = 256  # a key's part, a parameter's value, a reason
MAX_CANDIDATES = 32  # a tuning run's candidates a node reports


@dataclass(frozen=True)
class CandidateFigures:
    """One candidate of a tuning run as its node measured it, per call of the model: milliseconds, and joules above
    idle where an energy counter read them; `note` says why one has no figures (incorrect, out of budget, skipped)."""

    name: str
    ms: float | None = None
    joules: float | None = None
    note: str = ""
    seconds: float | None = None  # what the tuning run spent on it (None: nothing, or not said)

    def describe(self) -> str:
        figures = [f"{self.ms:.2f} ms"] if self.ms is not None else []
        figures += [f"{self.joules:.3g} J"] if self.joules is not None else []
        spent = [f"{self.seconds:.1f} s to measure"] if self.seconds is not None else []
        said = ", ".join([*figures, *([self.note] if self.note else []), *spent])
        return f"{self.name} {said}" if said else self.name


@dataclass(frozen=True)
class TuningOutcome:
    """What a shard ran and what tuning it paid for, as its node reports it (farm.proto result.ShardFigures)."""

    winner: str = ""  # the candidate the shard ran; "" the untuned model
    params: tuple[tuple[str, Param], ...] = ()
    reason: str = ""  # why it tuned or not (plan_tuning's), or where its winner came from
    tuning_s: float = 0.0  # spent tuning before this shard (0: none)
    tuning_j: float | None = None  # the tuning's joules above idle (None: not measured)
    # What the winner was measured on, for the farm's winners cache (WinnerKey).
    device_name: str = ""
    driver: str = ""
    torch_version: str = ""
    input_shapes: tuple[str, ...] = ()
    candidates: tuple[CandidateFigures, ...] = ()  # what its tuning run measured, in order (none: it tuned nothing)


@dataclass(frozen=True)
class WinnerKey:
    """What a winner holds for: a GPU model and driver, a torch version, the job's model (farm.head.kinds.base.
    model_key: its code, weights and input), the batch's input shapes, the tolerance and the objective."""

    device_name: str
    driver: str
    torch_version: str
    model_key: str
    input_shapes: tuple[str, ...]
    atol: float
    rtol: float
    objective: Objective

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]

    def fits(self, device_name: str, driver: str, torch_version: str, input_shapes: Sequence[str]) -> bool:
        """Whether this key's winner holds on a node's device, torch and batch (what only the node knows)."""
        return (self.device_name, self.driver, self.torch_version, self.input_shapes) == (
            device_name, driver, torch_version, tuple(input_shapes))


@dataclass(frozen=True)
class SharedWinner:
    """A winner one node found, handed with their shards to the nodes whose key it fits: they tune nothing."""

    key: WinnerKey
    winner: str
    params: tuple[tuple[str, Param], ...] = ()


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{what} is not a string of at most {MAX_TEXT} characters")
    return value


def check_outcome(outcome: TuningOutcome) -> TuningOutcome:
    """A node's outcome, checked: names, bounded strings, scalar parameters, finite non-negative costs (ValueError
    otherwise). A node is hostile until checked: whatever it sends becomes another node's forward."""
    if outcome.winner and not NAME.fullmatch(outcome.winner):
        raise ValueError(f"the winner's name {outcome.winner[:64]!r} is not a candidate's")
    if len(outcome.params) > MAX_PARAMS:
        raise ValueError(f"the winner has more than {MAX_PARAMS} parameters")
    for name, value in outcome.params:
        if not NAME.fullmatch(name):
            raise ValueError(f"a parameter's name {name[:64]!r} is not one")
        ok = isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)) or (
            isinstance(value, str) and len(value) <= MAX_TEXT)
        if not ok:
            raise ValueError(f"parameter {name!r} is not a bounded string, an integer, a finite number or a bool")
    for what in ("reason", "device_name", "driver", "torch_version"):
        _text(getattr(outcome, what), what)
    if len(outcome.input_shapes) > MAX_PARAMS:
        raise ValueError("too many input shapes")
    for shape in outcome.input_shapes:
        _text(shape, "an input shape")
    costs = [outcome.tuning_s, *([outcome.tuning_j] if outcome.tuning_j is not None else [])]
    if len(outcome.candidates) > MAX_CANDIDATES:
        raise ValueError(f"more than {MAX_CANDIDATES} candidates")
    for figures in outcome.candidates:
        if not NAME.fullmatch(figures.name):
            raise ValueError(f"a candidate's name {figures.name[:64]!r} is not one")
        _text(figures.note, "a candidate's note")
        costs += [c for c in (figures.ms, figures.joules, figures.seconds) if c is not None]
    if not all(math.isfinite(c) and c >= 0 for c in costs):
        raise ValueError("the tuning's cost or a candidate's figures are negative or not finite")
    return outcome


def shareable(outcome: TuningOutcome) -> bool:
    """Whether a node's outcome names a winner others can run: a tuning run's or a cached one, measured on a known
    device, torch and batch."""
    return bool(outcome.winner and outcome.device_name and outcome.torch_version and outcome.input_shapes)
