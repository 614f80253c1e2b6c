"""The optimizer: for one problem, the policy orders the candidates, the hardened evaluator measures them one by one
within a time budget, the cheapest correct one under the run's objective wins (if it beats the baseline by a margin),
and the winner cache and the policy learn from the run.

The objective (farm.core.tuning.Objective) is a job's policy's: `energy` (efficiency, a job's default) ranks by
joules per call above the device's idle draw, read on its energy counter over ~20 of its steps; `time` (throughput)
by the median milliseconds of cold-cache calls. The baseline a winner must beat is what the job runs untuned
(baseline_for): PyTorch's defaults (cuDNN convolutions in TF32) where its tolerance allows TF32, else strict fp32.

Each candidate is measured once and judged three ways from its recorded errors (Result.correct_under): under the
run's tolerance (which picks the winner), under fp32-strict 1e-4 and under loose 1e-2, so that one run yields both
scorings. Eager is measured first (the reference for correctness and reward). In a report's run torch.compile's
default is always measured too, after the search if the search did not reach it, because every speedup is reported
against both; a job's run (tune_module) measures it only where the policy ranks it within the budget.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from farm.core.speed_of_light import SpeedOfLight, speed_of_light
from farm.core.tuning import (MAX_CANDIDATES, MAX_TEXT, CallCost, CandidateFigures, Objective, SharedWinner,
                              TuningOutcome, TuningPlan, call_cost, least_tuning_s, plan_tuning)
from farm.core.tuning import pick as pick_winner
from farm_agent.tuner.cache import CacheKey, Winner, WinnerCache, make_key
from farm_agent.tuner.candidates import (BASELINES, EMULATED_FP32, FAMILY_BY_NAME, UNTUNED, as_measured, build,
                                         candidate, candidates_for, Untuned, untried_order, untuned_precision)
from farm_agent.tuner.energy import idle_watts, open_meter
from farm_agent.tuner.evaluator import OUT_OF_BUDGET, Candidate, Evaluation, Result
from farm_agent.tuner.features import model_features
from farm_agent.tuner.policy import PRIOR_OTHER_TRIAL_S, Policy, reward
from farm_agent.tuner.problem import Problem, load_problem, one_line

STRICT = (1e-4, 1e-4)  # (atol, rtol): fp32-strict, the spec's default
LOOSE = (1e-2, 1e-2)  # the scoring that lets precision drop
WORTH_TRYING = math.log(1.05)  # stop once no untried candidate is plausibly 5% faster than the best so far


@dataclass(frozen=True)
class Trial:
    """One candidate, measured once."""

    candidate: str
    lowers_precision: bool
    compiled: bool
    correct: bool  # under the run's tolerance
    correct_strict: bool
    correct_loose: bool
    median_ms: float | None
    max_abs_err: float | None
    rel_norm_err: float | None
    seconds: float  # wall time of its evaluation: building, compiling, checking, timing
    searched: bool  # False: measured after the search stopped, only as a baseline for the report
    error: str | None = None
    joules_per_call: float | None = None  # above idle, over its energy run (None: no energy counter)

    def cost(self) -> CallCost | None:
        return CallCost(self.median_ms, self.joules_per_call) if self.median_ms is not None else None

    def on(self, objective: Objective) -> float | None:
        """Its cost on the objective; energy falls back to time where no counter read it."""
        value = self.joules_per_call if objective is Objective.ENERGY else None
        return value if value is not None else self.median_ms

    def measured_on(self, objective: Objective) -> float | None:
        """Its cost on the objective as measured: joules per call under energy (None without a counter), never its
        time in their place (gains are never joules over milliseconds)."""
        return self.joules_per_call if objective is Objective.ENERGY else self.median_ms

    def correct_by(self, scoring: str) -> bool:
        return {"run": self.correct, "strict": self.correct_strict, "strict-ieee": self.correct_strict,
                "loose": self.correct_loose}[scoring]


@dataclass(frozen=True)
class TuneReport:
    problem: str
    device: str
    device_name: str
    atol: float
    rtol: float
    budget_s: float
    features: dict[str, Any]
    order: list[str]  # the search order the policy chose at the start
    trials: list[Trial]
    skipped: list[str]  # not tried: predicted not to fit the budget, or not plausibly faster
    stop_reason: str
    seconds: float
    winner: str | None = None
    cache_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    flops: float | None = None  # the reference's matrix/conv FLOPs and its bytes (inputs, parameters, outputs)
    nbytes: float | None = None
    objective: Objective = Objective.TIME
    baseline: str = "eager"  # what the job runs untuned: the winner had to beat it by farm.core.tuning.MARGIN
    idle_w: float | None = None  # the device's idle draw the joules per call are above
    start_s: float = 0.0  # starting the evaluator's child (its CUDA context, the model, the reference's FLOPs)

    def speed_of_light(self) -> SpeedOfLight | None:
        """The problem's fp32 speed of light on this device (farm.core.kernels.speed_of_light)."""
        if self.flops is None or self.nbytes is None:
            return None
        return speed_of_light(self.flops, self.nbytes, self.device_name)

    def sol_share(self, scoring: str = "run", objective: Objective | None = None) -> float | None:
        """The share of the speed of light (a time) that the pick under `scoring` and `objective` reaches."""
        best, sol = self.pick(scoring, objective), self.speed_of_light()
        return sol.share(best.median_ms) if best is not None and sol is not None else None

    def trial(self, name: str) -> Trial | None:
        return next((t for t in self.trials if t.candidate == name), None)

    def pick(self, scoring: str = "run", objective: Objective | None = None) -> Trial | None:
        """The cheapest trial on `objective` (None: the report's) correct under `scoring` ("run", "strict",
        "strict-ieee" or "loose"); under strict, only candidates that keep fp32 arithmetic qualify; under
        strict-ieee, only those whose products are fp32 too (no split-TF32). A run measured under energy holds
        each trial's time too, so both objectives' picks come from one run."""
        ok = [t for t in self.trials if t.correct_by(scoring) and t.median_ms is not None
              and not (scoring.startswith("strict") and t.lowers_precision)
              and not (scoring == "strict-ieee" and t.candidate in EMULATED_FP32)]
        return min(ok, key=lambda t: t.on(objective or self.objective) or math.inf, default=None)

    def baseline_ms(self, name: str) -> float | None:
        """A baseline's time as PyTorch runs it by default (cuDNN's TF32 convolutions included, which can miss
        fp32-strict): measured and sound is enough, whatever the scoring."""
        t = self.trial(name)
        return t.median_ms if t is not None else None

    def speedup(self, baseline: str, scoring: str = "run", objective: Objective | None = None) -> float | None:
        """The pick's gain over `baseline` on `objective` (None: the report's): time over time, or joules per call
        over joules per call (None where either lacks its joules: never joules over milliseconds)."""
        objective = objective or self.objective
        best, base = self.pick(scoring, objective), self.trial(baseline)
        if best is None or base is None:
            return None
        mine, theirs = best.measured_on(objective), base.measured_on(objective)
        return theirs / mine if mine and theirs is not None else None

    @property
    def trials_to_winner(self) -> int | None:
        searched = [t.candidate for t in self.trials if t.searched]
        return searched.index(self.winner) + 1 if self.winner in searched else None

    def to_json(self) -> dict[str, Any]:
        sol = self.speed_of_light()
        return {**asdict(self), "trials_to_winner": self.trials_to_winner,
                "speedup_vs_eager": self.speedup("eager"), "speedup_vs_compile": self.speedup("compile-default"),
                "speed_of_light": asdict(sol) if sol is not None else None,
                "sol_share": {s: self.sol_share(s) for s in ("run", "strict", "loose")}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneReport:
        """A report from to_json's dict (or asdict's): what to_json derives is made again, not read."""
        names = {f.name for f in fields(cls)}
        kept = {k: v for k, v in data.items() if k in names}
        kept["trials"] = [Trial(**t) for t in kept["trials"]]
        kept["objective"] = Objective(kept.get("objective", Objective.TIME.value))
        return cls(**kept)


def _trial(result: Result, cand: Candidate, seconds: float, searched: bool, idle_w: float | None = None) -> Trial:
    joules = None
    if result.energy_calls and result.energy_s and result.energy_j is not None:
        joules = call_cost(result.energy_calls, result.energy_s, result.energy_j, idle_w).joules
    return Trial(joules_per_call=joules,
        candidate=cand.name, lowers_precision=cand.lowers_precision, compiled=bool(result.compiled),
        correct=bool(result.correct), correct_strict=bool(result.correct_under(*STRICT)),
        correct_loose=bool(result.correct_under(*LOOSE)), median_ms=result.median_ms,
        max_abs_err=result.max_abs_err, rel_norm_err=result.rel_norm_err, seconds=seconds, searched=searched,
        error=result.error,
    )


MeasureRound = Callable[[list[Candidate]], tuple[list[Result], float]]
"""Evaluates candidates (eager comes back first, measured by the first round only): results and seconds."""


def _evaluator_rounds(evaluation: Evaluation, deadline: float | None = None) -> MeasureRound:
    def measure(cands: list[Candidate]) -> tuple[list[Result], float]:
        started = time.perf_counter()
        results = evaluation.run(cands, deadline=deadline)
        return results, time.perf_counter() - started
    return measure


@dataclass(frozen=True)
class Measured:
    name: str
    result: Result
    seconds: float
    searched: bool


def search(names: Sequence[str], context: Sequence[float], policy: Policy, budget_s: float, measure: MeasureRound,
           *, exhaustive: bool = False, round_size: int = 3, always: Sequence[str] = BASELINES,
           deadline: float | None = None) -> tuple[list[str], list[Measured], list[str], str]:
    """Measure candidates in the policy's order, a round at a time, until the budget or the chance of a better one
    runs out. Returns the search order, the measurements, what was skipped and why the search stopped.

    A round is one evaluator call (the evaluator keeps its child and its eager reference from one round to the next).
    The first round also carries the baselines (`always`: the job's untuned one first, measured right after eager,
    then the report's, compile-default, after the round's candidates). Each candidate's own seconds are what the
    policy's cost regression learns from (where an evaluator does not give them, a round's wall time shared in
    proportion to the predicted costs). No round starts past `deadline` (time.monotonic()), and a round's candidates
    must fit the time left to it: a run's start (saving the model, its analysis, the evaluator's child) is spent
    from the same budget.
    """
    ranked = policy.rank(context, [n for n in names if n != "eager"])
    estimates = {e.name: e for e in ranked}
    order = ["eager", *estimates]
    pending = list(estimates)
    measured: list[Measured] = []
    skipped: list[str] = []
    spent = 0.0
    eager_ms: float | None = None
    best = 0.0  # reward of the best correct candidate so far: eager's is 0
    stop_reason = "all tried"
    first = True
    while first or pending:
        if not first and not exhaustive and estimates[pending[0]].upper < best + WORTH_TRYING:
            skipped.extend(pending)  # ranked by upper bound: none after this one is plausibly better either
            stop_reason = "no candidate left is plausibly 5% faster"
            break
        left = budget_s - spent
        if deadline is not None:
            left = min(left, deadline - time.monotonic())
        if not first and not exhaustive and left <= 0:
            skipped.extend(pending)
            stop_reason = "budget"
            break
        batch: list[str] = []
        planned = 0.0
        while pending and (exhaustive or len(batch) < round_size):
            name = pending.pop(0)
            if exhaustive or planned + estimates[name].seconds <= left:
                batch.append(name)
                planned += estimates[name].seconds
            else:
                skipped.append(name)
                stop_reason = "budget"
        baseline = [n for n in always if first and n in estimates and n not in batch]
        pending = [n for n in pending if n not in baseline]
        skipped = [n for n in skipped if n not in baseline]
        if not first and not batch:
            continue
        # The job's own baseline (always[0]) right after eager, so that a budget cut short still leaves a winner its
        # yardstick; the other baselines after the round's candidates.
        up_first = [n for n in always[:1] if n in batch or n in baseline]
        ordered = [*up_first, *(n for n in [*batch, *baseline] if n not in up_first)]
        results, seconds = measure([candidate(n) for n in ordered])
        spent += seconds
        by_name = {r.candidate: r for r in results}
        in_round = [*(["eager"] if first else []), *batch, *baseline]
        if first:
            eager_ms = by_name["eager"].median_ms
            if (eager_s := by_name["eager"].seconds) is not None:
                # A prior is a family's build; checking, timing and metering the model's call costs what eager's did.
                estimates = {n: replace(e, seconds=e.seconds + eager_s) if e.prior else e for n, e in estimates.items()}
        weights = {n: estimates[n].seconds if n in estimates else PRIOR_OTHER_TRIAL_S for n in [*in_round, "eager"]}
        total = sum(weights.values())
        for name in in_round:
            result = by_name[name]
            own = result.seconds if result.seconds is not None else seconds * weights[name] / total
            measured.append(Measured(name, result, own, searched=name not in baseline))
            best = max(best, reward(bool(result.correct), result.median_ms, eager_ms))
        first = False
    return order, measured, skipped, stop_reason


def baseline_for(names: Sequence[str]) -> str:
    """What the job runs untuned, among the candidates offered: PyTorch's defaults where they are offered (a GPU,
    a model with convolutions or matrix products, and a tolerance that allows TF32), else strict fp32 eager."""
    return "pytorch-defaults" if "pytorch-defaults" in names else "eager"


def choose(trials: Sequence[Trial], baseline: str, objective: Objective) -> Trial | None:
    """The winner: the cheapest correct trial on the objective if it beats the baseline by farm.core.tuning.MARGIN,
    else the baseline (counted at its cost even where it misses the tolerance: the job runs it all the same)."""
    costs = {t.candidate: c for t in trials if (t.correct or t.candidate == baseline) and (c := t.cost()) is not None}
    if baseline not in costs:
        return None
    name = pick_winner(costs, baseline, objective)
    return next(t for t in trials if t.candidate == name)


def tune(problem: Path | str | Problem, *, budget_s: float = 120.0, atol: float = STRICT[0], rtol: float = STRICT[1],
         device: str = "cuda", policy: Policy | None = None, policy_path: Path | None = None,
         cache: WinnerCache | None = None, runs: int = 20, exhaustive: bool = False,
         candidates: Sequence[str] | None = None, cache_key: CacheKey | None = None,
         candidate_timeout_s: float = 300.0, objective: Objective = Objective.TIME,
         idle_w: float | None = None, deadline: float | None = None, report_baselines: bool = True) -> TuneReport:
    """Tune one problem file for `objective`: returns the report; updates the winner cache (under `cache_key`, by
    default the problem's model, inputs, tolerance and objective) and the policy (saved to policy_path, default
    FARM_STATE_DIR/tuner/policy.json, unless a policy object is passed in). `report_baselines`: compile-default is
    measured whether or not the search reaches it, for the reports' speedups against it (a job's run, which pays
    for its seconds in the job, measures it only as a candidate the policy ranks).

    Under `energy` on a GPU with an energy counter, each candidate's joules per call are read on it (~2 s more per
    candidate) above `idle_w` (measured here first when not given: ~2 s with nothing running). Elsewhere energy
    ranks by time, and the report says so (no joules in its trials)."""
    started = time.perf_counter()
    # The budget holds for the whole run: a candidate still running when it is spent is stopped. Its first round
    # alone (a fresh process, the baselines' compiles, ~2 s a candidate for energy) took a job's 20 s budget to
    # 73.9 s on an H100.
    if not exhaustive:  # `deadline` (time.monotonic's): a caller's, from before it saved the model
        deadline = min(deadline or math.inf, time.monotonic() + budget_s)
    else:
        deadline = None
    prob = problem if isinstance(problem, Problem) else load_problem(problem)
    model = prob.model(device)
    inputs = prob.inputs(device, seed=0)
    features = model_features(model, inputs, rtol, device)
    context = features.vector()
    owns_policy = policy is None
    policy = policy if policy is not None else Policy.load(policy_path)
    names = untried_order([c.name for c in candidates_for(model, inputs, rtol, device)], rtol, features.op_count)
    baseline = baseline_for(names)
    if candidates is not None:
        names = [n for n in names if n in candidates or n in BASELINES or n == baseline]
    energy = objective is Objective.ENERGY and torch.device(device).type == "cuda"
    if energy and idle_w is None:
        idle_w = idle_watts(open_meter(torch.device(device)))

    always = tuple(dict.fromkeys([baseline, *(BASELINES if report_baselines else ())]))
    with Evaluation(prob.path, device=device, atol=atol, rtol=rtol, runs=runs, timeout_s=candidate_timeout_s,
                    energy=energy) as evaluation:
        order, measured, skipped, stop_reason = search(
            names, context, policy, budget_s, _evaluator_rounds(evaluation, deadline), exhaustive=exhaustive,
            always=always, deadline=deadline)
        start_s = evaluation.start_s
    trials = [_trial(m.result, candidate(m.name), m.seconds, m.searched, idle_w) for m in measured]
    eager_result = next((m.result for m in measured if m.name == "eager"), None)

    eager = next((t for t in trials if t.candidate == "eager"), None)
    eager_ms = eager.median_ms if eager is not None else None
    for t in trials:
        if t.error != OUT_OF_BUDGET:  # not measured: nothing to learn of it
            policy.update(context, t.candidate, reward(t.correct, t.median_ms, eager_ms), t.seconds)
    policy.runs += 1
    if owns_policy:
        policy.save(policy_path)

    key = cache_key or make_key(model, inputs, atol, rtol, device, objective)
    report = TuneReport(problem=prob.name, device=device, device_name=key.device_name, atol=atol, rtol=rtol,
                        budget_s=budget_s, features=features.to_json(), order=order, trials=trials,
                        skipped=skipped, stop_reason=stop_reason, seconds=time.perf_counter() - started,
                        flops=eager_result.flops if eager_result else None,
                        nbytes=eager_result.bytes if eager_result else None, objective=objective,
                        baseline=baseline, idle_w=idle_w, start_s=start_s)
    best = choose(trials, baseline, objective)
    if best is None:
        return report
    base = report.trial(baseline)
    compile_trial = report.trial("compile-default")
    winner = Winner(candidate=best.candidate, params=dict(candidate(best.candidate).params),
                    lowers_precision=best.lowers_precision, median_ms=float(best.median_ms or 0.0),
                    eager_ms=eager_ms, compile_ms=compile_trial.median_ms if compile_trial else None,
                    joules_per_call=best.joules_per_call, baseline=baseline,
                    baseline_ms=base.median_ms if base else None,
                    baseline_joules=base.joules_per_call if base else None)
    path = (cache or WinnerCache()).put(key, winner, extra={"problem": prob.name})
    return TuneReport(**{**report.__dict__, "winner": best.candidate, "cache_path": str(path)})


_JOB_PROBLEM = '''"""A job's model as a tuning problem, written by farm_agent.tuner.tune.tune_module."""
import sys

import torch

sys.path[:0] = [p for p in {sys_path!r} if p not in sys.path]  # where the job's model class imports from
MODEL_FILE = {model_file!r}
SHAPE, DTYPE, LOW, HIGH = {shape!r}, torch.{dtype}, {low!r}, {high!r}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.load(MODEL_FILE, weights_only=False, map_location="cpu")

    def forward(self, x):
        return self.inner(x)


def get_inputs():
    # Fresh random inputs in the example batch's range: real-looking data, never zeros.
    if DTYPE.is_floating_point:
        return [LOW + (HIGH - LOW) * torch.rand(SHAPE, dtype=DTYPE)]
    return [torch.randint(int(LOW), int(HIGH) + 1, SHAPE, dtype=DTYPE)]


def get_init_inputs():
    return []
'''


def tune_module(module: torch.nn.Module, example_batch: torch.Tensor, tolerance: tuple[float, float] = STRICT,
                device: str = "cuda", budget_s: float = 120.0, cache: WinnerCache | None = None,
                policy: Policy | None = None, objective: Objective = Objective.TIME,
                deadline: float | None = None, idle_w: float | None = None) -> TuneReport:
    """Tune a job's model for batches shaped like `example_batch`: the model is saved whole and wrapped in a
    problem file, so that the evaluator measures it in its own process like any problem; the winner is cached
    under the job's model itself."""

    atol, rtol = tolerance
    key = make_key(module, [example_batch], atol, rtol, device, objective)
    low, high = float(example_batch.min()), float(example_batch.max())
    if high <= low:
        high = low + 1.0
    with tempfile.TemporaryDirectory(prefix="farm-tune-") as folder:
        model_file = Path(folder) / "model.pt"
        save_whole(module, model_file)
        problem = Path(folder) / "job_model.py"
        problem.write_text(_JOB_PROBLEM.format(
            sys_path=[p for p in sys.path if p], model_file=str(model_file), shape=list(example_batch.shape),
            dtype=str(example_batch.dtype).removeprefix("torch."), low=low, high=high))
        return tune(problem, budget_s=budget_s, atol=atol, rtol=rtol, device=device, cache=cache, cache_key=key,
                    policy=policy, objective=objective, deadline=deadline, report_baselines=False, idle_w=idle_w)


def save_whole(module: torch.nn.Module, path: Path) -> None:
    """The job's model saved whole, for the evaluator's process to load: the job's own code, on the job's own node,
    as the worker's account (nothing here reaches the head). With cloudpickle where it is installed, which saves by
    value the classes a model builder defines inside itself: pickle cannot (`Can't pickle local object`, which
    failed a tuned job's shards on an H100)."""
    try:
        import cloudpickle
    except ImportError:
        torch.save(module, path)
        return
    torch.save(module, path, pickle_module=cloudpickle)


def untuned_s_per_row(module: torch.nn.Module, example_batch: torch.Tensor, calls: int = 3) -> float:
    """Seconds per row of the model as the job runs it untuned, from a few calls on the example batch (after one
    untimed call, which pays the first call's one-off costs)."""
    device = example_batch.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with torch.inference_mode(), untuned_precision():
        module(example_batch)
        sync()
        began = time.perf_counter()
        for _ in range(calls):
            module(example_batch)
        sync()
    return (time.perf_counter() - began) / (calls * max(len(example_batch), 1))


def tuned_module(module: torch.nn.Module, example_batch: torch.Tensor, tolerance: tuple[float, float] = STRICT,
                 device: str = "cuda", cache: WinnerCache | None = None, tune_first: bool = False,
                 budget_s: float = 120.0, objective: Objective = Objective.TIME, rows_left: int | None = None
                 ) -> Callable[..., Any]:
    """`module` as the tuner's cached winner runs it (tuned_forward, without what it says of it)."""
    return tuned_forward(module, example_batch, tolerance, device, cache, tune_first, budget_s, objective,
                         rows_left)[0]


def shared_winner(key: CacheKey, shared: Sequence[SharedWinner]) -> Winner | None:
    """The farm's winner for this node's key (farm.core.tuning.WinnerKey: the head matched the model, tolerance and
    objective; the device, driver, torch and batch shapes are matched here), if it names a family this agent knows
    with that family's own parameters: a head's word is checked like a stranger's before it becomes a forward."""
    for found in shared:
        if not found.key.fits(key.device_name, key.driver, key.torch_version, key.input_shapes):
            continue
        family = FAMILY_BY_NAME.get(found.winner)
        if family is None or dict(found.params) != dict(family.params) or family.name in UNTUNED:
            continue
        if family.min_rtol > key.rtol:  # a precision the job's tolerance does not allow (fp16 for a strict job)
            continue
        return Winner(candidate=family.name, params=dict(family.params), lowers_precision=family.lowers_precision,
                      median_ms=0.0, eager_ms=None, compile_ms=None)
    return None


def disagreement(forward: Callable[..., Any], module: torch.nn.Module, batch: torch.Tensor, atol: float,
                 rtol: float) -> str | None:
    """Why `forward` does not answer `batch` as the model does in full fp32, by the evaluator's measure of a
    tolerance (None: it does). A winner the farm shares is checked so on this node's own batch before it runs a row:
    the node that reported it chose which known transform the farm runs (a hostile one would choose a wrong one),
    and a transform right for the batch it was measured on may not be for this one, or may not run here at all."""
    from farm_agent.tuner.worker import Errors, Rejected, strict_precision, tensors_of

    errors = Errors(atol, rtol)
    try:
        with torch.no_grad():
            answers = tensors_of(forward(batch), "winner")
            with strict_precision():
                expected = tensors_of(module(batch), "Model")
            errors.add(answers, expected)
    except (Rejected, RuntimeError, ValueError, TypeError, AttributeError) as exc:  # a compiler's, or the outputs'
        return f"fails on this node's batch ({type(exc).__name__}: {one_line(str(exc))})"
    if errors.rel_norm <= max(atol, rtol) and errors.excess[rtol] <= atol:
        return None
    return "answers this node's batch outside the job's tolerance"


@torch.inference_mode(False)  # a shard runs in it: the run's analysis (features, candidates) sees what a script sees
def _tuning_run(module: torch.nn.Module, example_batch: torch.Tensor, tolerance: tuple[float, float], device: str,
                budget_s: float, cache: WinnerCache, objective: Objective, idle_w: float | None = None
                ) -> tuple[float, float | None, TuneReport]:
    """A tuning run now: its seconds, its joules above the device's idle draw where a counter read them, and its
    report. The budget holds from here: saving the model and reading the idle draw (unless `idle_w` gives the
    agent's reading, which the job's energy is above) count against it."""
    meter = open_meter(torch.device(device)) if torch.device(device).type == "cuda" else None
    began = time.perf_counter()
    deadline = time.monotonic() + budget_s
    if meter is None:
        report = tune_module(module, example_batch, tolerance, device, budget_s, cache, objective=objective,
                             deadline=deadline, idle_w=idle_w)
        return time.perf_counter() - began, None, report
    with meter.window() as window:
        report = tune_module(module, example_batch, tolerance, device, budget_s, cache, objective=objective,
                             deadline=deadline, idle_w=idle_w)
    seconds, energy = time.perf_counter() - began, window.energy
    if energy is None:
        return seconds, None, report
    idle = report.idle_w if report.idle_w is not None else idle_watts(meter)
    return seconds, max(energy.joules - (idle or 0.0) * energy.seconds, 0.0), report


def candidate_figures(report: TuneReport) -> tuple[CandidateFigures, ...]:
    """A tuning run's candidates as a shard reports them (farm.core.tuning.CandidateFigures): each measured one's ms
    and joules per call, or why it has none; then those it did not try."""
    said: list[CandidateFigures] = []
    for trial in report.trials:
        note = one_line(trial.error, MAX_TEXT) if trial.error else ("" if trial.correct else
                                                                    "incorrect at the job's tolerance")
        said.append(CandidateFigures(trial.candidate, None if trial.error else trial.median_ms,
                                     None if trial.error else trial.joules_per_call, note,
                                     trial.seconds or None))
    said += [CandidateFigures(name, note=f"not tried: {report.stop_reason}"[:MAX_TEXT]) for name in report.skipped]
    return tuple(said[:MAX_CANDIDATES])


def tuned_forward(module: torch.nn.Module, example_batch: torch.Tensor, tolerance: tuple[float, float] = STRICT,
                  device: str = "cuda", cache: WinnerCache | None = None, tune_first: bool = False,
                  budget_s: float = 120.0, objective: Objective = Objective.TIME, rows_left: int | None = None,
                  shared: Sequence[SharedWinner] = (), idle_w: float | None = None
                  ) -> tuple[Callable[..., Any], TuningOutcome]:
    """`module` as the tuner's winner runs it, for this GPU, model, batch shape, tolerance and objective, and what
    was run and why (reported with the shard, farm.core.tuning.TuningOutcome). The winner is this node's cached
    one, else one the farm shares (`shared`), else, with `tune_first`, the winner of a tuning run made now if it can
    pay for itself over `rows_left` (farm.core.tuning.plan_tuning; None: no cap but the budget). Untuned, the model
    runs at PyTorch's defaults (untuned_precision); a winner at the precision it was measured at (as_measured).
    `idle_w`: the device's idle draw as its agent read it (farm.core.tasks.Tuning.idle_w)."""
    atol, rtol = tolerance
    cache = cache or WinnerCache()
    key = make_key(module, [example_batch], atol, rtol, device, objective)
    said = TuningOutcome(device_name=key.device_name, driver=key.driver, torch_version=key.torch_version,
                         input_shapes=key.input_shapes)
    winner = cache.get(key)
    why = "a cached winner for this GPU, model, shapes, tolerance and objective"
    from_farm = False
    if winner is None and (winner := shared_winner(key, shared)) is not None:
        why = "a winner the farm shares for this GPU kind, model, shapes, tolerance and objective: tuned nothing"
        from_farm = True
    cost: tuple[float, float | None] = (0.0, None)
    figures: tuple[CandidateFigures, ...] = ()
    if winner is None and tune_first:
        plan = TuningPlan(True, budget_s, "no cap: the rows left are not known")
        if rows_left is not None:
            # Both sides in device-seconds: the device draws about as much tuning as running the job, so under
            # `energy` the same comparison holds in joules to within that ratio.
            per_row = untuned_s_per_row(module, example_batch)
            plan = plan_tuning(budget_s=budget_s, rows_left=rows_left, tuning_per_s=1.0, objective=Objective.TIME,
                               baseline_per_row=per_row, least_s=least_tuning_s(per_row * len(example_batch)))
        print(f"farm tuner: {'tuning' if plan.tune else 'not tuning'}: {plan.reason}", file=sys.stderr)
        why = f"{'tuned' if plan.tune else 'not tuned'}: {plan.reason}"
        if plan.tune:
            began = time.perf_counter()
            try:
                seconds, joules, report = _tuning_run(module, example_batch, tolerance, device, plan.budget_s,
                                                      cache, objective, idle_w)
                cost = (seconds, joules)
                figures = candidate_figures(report)
                winner = cache.get(key)
                if winner is None or winner.candidate in UNTUNED:
                    why += "; no candidate beat the untuned model by the margin"
            except Exception as exc:  # noqa: BLE001 - a tuning run that fails leaves the job untuned, never failed
                cost = (time.perf_counter() - began, None)
                first = one_line(str(exc))
                why += f"; the tuning run failed ({type(exc).__name__}: {first}): the model runs untuned"
                print(f"farm tuner: the tuning run failed: {type(exc).__name__}: {first}", file=sys.stderr)
    said = replace(said, reason=why[:MAX_TEXT], tuning_s=cost[0], tuning_j=cost[1], candidates=figures)
    if winner is None or winner.candidate in UNTUNED or winner.source is not None:  # a proposal is no transform
        return Untuned(module), said
    try:
        forward = as_measured(build(winner.candidate, module, [example_batch], winner.params),
                              winner.lowers_precision)
    except Exception as exc:  # a winner measured elsewhere in this key's life may not build now: run untuned
        print(f"farm tuner: cached winner {winner.candidate} does not build here ({type(exc).__name__}: {exc}); "
              "running the model untuned", file=sys.stderr)
        return Untuned(module), replace(said, reason=f"the winner {winner.candidate} does not build here"[:MAX_TEXT])
    if from_farm and (why_not := disagreement(forward, module, example_batch, atol, rtol)) is not None:
        print(f"farm tuner: the farm's winner {winner.candidate} {why_not}; running the model untuned",
              file=sys.stderr)
        return Untuned(module), replace(said, reason=f"the farm's winner {winner.candidate} {why_not}: not run"
                                        [:MAX_TEXT])
    params = tuple(sorted((k, v) for k, v in winner.params.items() if isinstance(v, (str, int, float, bool))))
    return forward, replace(said, winner=winner.candidate, params=params)


@dataclass(frozen=True)
class Summary:
    """A folder's figures under one scoring ("run", "strict" or "loose") and one objective (the gains: in time, or
    in joules per call above idle)."""

    scoring: str
    problems: int
    correct: int  # problems with a correct pick
    fast_p: float  # share of problems whose pick is correct and cheaper than compile-default by more than p
    p: float
    geomean_vs_eager: float | None
    geomean_vs_compile: float | None
    geomean_sol_share: float | None = None  # over the problems whose device has recorded peaks
    objective: Objective = Objective.TIME


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(reports: Sequence[TuneReport], scoring: str = "run", p: float = 0.05,
              objective: Objective = Objective.TIME) -> Summary:
    """fast_p counts a problem when its pick is correct under the scoring and compile-default was measured (under
    energy: with its joules); the geometric means run over the problems where both sides were measured."""
    vs_eager = [s for r in reports if (s := r.speedup("eager", scoring, objective)) is not None]
    vs_compile = [s for r in reports if (s := r.speedup("compile-default", scoring, objective)) is not None]
    fast = sum(1 for s in vs_compile if s > 1.0 + p)
    shares = [s for r in reports if (s := r.sol_share(scoring, objective)) is not None]
    return Summary(scoring=scoring, problems=len(reports),
                   correct=sum(1 for r in reports if r.pick(scoring, objective)),
                   fast_p=fast / len(reports) if reports else 0.0, p=p, geomean_vs_eager=_geomean(vs_eager),
                   geomean_vs_compile=_geomean(vs_compile), geomean_sol_share=_geomean(shares), objective=objective)


def table_row(report: TuneReport, scoring: str = "run", objective: Objective = Objective.TIME) -> dict[str, Any]:
    """One problem's line of the tune table under a scoring and an objective (`cost`: the pick's and the baselines'
    ms under time, J per call under energy)."""
    best = report.pick(scoring, objective)
    sol = report.speed_of_light()

    def cost(trial: Trial | None) -> float | None:
        return trial.measured_on(objective) if trial is not None else None

    return {
        "problem": report.problem,
        "winner": best.candidate if best else None,
        "lowers_precision": bool(best and best.lowers_precision),
        "emulated_fp32": bool(best and best.candidate in EMULATED_FP32),
        "winner_ms": best.median_ms if best else None,
        "eager_ms": report.baseline_ms("eager"),
        "compile_ms": report.baseline_ms("compile-default"),
        "winner_cost": cost(best),
        "eager_cost": cost(report.trial("eager")),
        "compile_cost": cost(report.trial("compile-default")),
        "vs_eager": report.speedup("eager", scoring, objective),
        "vs_compile": report.speedup("compile-default", scoring, objective),
        "trials": sum(1 for t in report.trials if t.searched),
        "seconds": report.seconds,
        "sol_ms": sol.ms if sol is not None else None,
        "sol_share": report.sol_share(scoring, objective),
        "sol_bound": sol.bound if sol is not None else None,
    }


def format_table(reports: Sequence[TuneReport], scoring: str = "run", p: float = 0.05,
                 objective: Objective = Objective.TIME) -> str:
    """The tune table as plain text, with fast_p and the geometric means last; under energy its costs and gains
    are joules per call above idle (the pick's time beside them, and its share of the speed of light)."""
    def num(value: float | None, fmt: str) -> str:
        return format(value, fmt) if value is not None else "-"

    energy = objective is Objective.ENERGY
    unit = "J" if energy else "ms"
    header = (f"{'problem':<28} {'winner':<26} {unit:>9} {'eager ' + unit:>9} {'compile ' + unit:>10} "
              f"{'vs eager':>8} {'vs compile':>10} {'SoL ms':>8} {'of SoL':>7} {'bound':<7} {'trials':>6} "
              f"{'search s':>8}" + (f" {'ms':>9}" if energy else ""))
    lines = [header]
    fmt = "9.4f" if energy else "9.3f"
    for report in reports:
        row = table_row(report, scoring, objective)
        mark = " *" if row["lowers_precision"] else " †" if row["emulated_fp32"] else ""
        winner = (row["winner"] or "none correct") + mark
        share = f"{row['sol_share']:.1%}" if row["sol_share"] is not None else "-"
        lines.append(f"{row['problem'][:28]:<28} {winner[:26]:<26} {num(row['winner_cost'], fmt)} "
                     f"{num(row['eager_cost'], fmt)} {num(row['compile_cost'], fmt.replace('9', '10'))} "
                     f"{num(row['vs_eager'], '7.2f')}x {num(row['vs_compile'], '9.2f')}x "
                     f"{num(row['sol_ms'], '8.3f')} {share:>7} {row['sol_bound'] or '-':<7} {row['trials']:>6} "
                     f"{row['seconds']:8.1f}" + (f" {num(row['winner_ms'], '9.3f')}" if energy else ""))
    s = summarize(reports, scoring, p, objective)
    share = f"{s.geomean_sol_share:.1%}" if s.geomean_sol_share is not None else "-"
    cheaper = "fewer joules a call" if energy else "faster"
    lines.append(f"{scoring} ({objective.value}): fast_{s.p:g} {s.fast_p:.1%} of {s.problems} (correct and "
                 f">{s.p:.0%} {cheaper} than compile-default); geomean {num(s.geomean_vs_eager, '.2f')}x vs eager, "
                 f"{num(s.geomean_vs_compile, '.2f')}x vs compile; geomean share of the speed of light {share}   "
                 "(* lowers precision; † split-TF32 products, fp32-level error)")
    peaks = {sol.peaks.describe() for r in reports if (sol := r.speed_of_light()) is not None}
    if peaks:
        lines.append("speed of light: max(FLOPs / fp32 peak, bytes / memory bandwidth) with "
                     + "; ".join(sorted(peaks)))
    return "\n".join(lines)
