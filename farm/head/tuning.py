"""The head's side of the kernel tuner, for inference jobs that ask for tuning (`tune_budget_s`).

- The in-job A/B (farm.core.tuning.ab_verdict): per node and device, a job's first shards run eager (untuned), the
  next ones the winner; once both sides hold enough items, the job's own in-shard figures decide whether the winner
  runs the rest or eager does.
- The winners the farm shares (the store's winners): a node's winner is kept under its WinnerKey, and handed with
  their shards to later jobs of the same model, whose nodes of the same GPU kind then tune nothing.
- What tuning did, in the job's log as lines that start with TUNING (`farm job ID --explain` prints them): whether it
  ran and why, the winner, its seconds and joules, and the A/B's verdict with its speed-up, items per joule above
  idle against eager and the item count at which it paid off (or that it was reverted, and why).
"""

from __future__ import annotations

import math
from dataclasses import replace

from farm.core.energy import EnergySource
from farm.core.models import Shard, ShardState
from farm.core.spec import InferenceSpec, parse_spec
from farm.core.tasks import Tuning
from farm.core.tuning import (AbShard, AbState, AbVerdict, Objective, ShardRate, SharedWinner, TuningOutcome,
                              WinnerKey, ab_min_items, ab_verdict, objective_for, paid_off_items, shareable)
from farm.head.store import Job, Store

TUNING = "tuning: "  # the job log's tuning lines start so
TUNING_S, TUNING_J = "tuning_s", "tuning_j"  # a shard's metrics: the tuning its node did before it


def shard_tuning(store: Store, job: Job, spec: InferenceSpec, node_id: str, device: str, base: Tuning) -> Tuning:
    """The tuning a shard goes with: `base` (tolerance, budget, objective, rows left) as it is for a job that asks
    for no tuning; else the A/B's side on this device (eager: tune nothing), with the winners the farm shares for
    the job's model, tolerance and objective."""
    if spec.tune_budget_s is None:
        return base
    verdict = ab_verdict(ab_shards(job, node_id, device), base.objective, ab_min_items(job.items))
    if not verdict.runs_winner:
        return replace(base, eager=True)
    return replace(base, shared=tuple(store.winners_for(job.model_key, base.atol, base.rtol, base.objective)),
                   idle_w=counter_idle_w(store, node_id, device))


def counter_idle_w(store: Store, node_id: str, device: str) -> float | None:
    """The device's idle draw its agent read on its energy counter (the one a tuning run reads joules on), if it
    read one there."""
    offers = [o for node in store.nodes(node_id) for o in node.backends if o.device == device]
    idle = next((o.idle_w for o in offers if o.idle_source == EnergySource.COUNTER.value), None)
    return idle if idle is not None and math.isfinite(idle) and idle >= 0 else None


def ab_shards(job: Job, node_id: str, device: str, before: int | None = None) -> list[AbShard]:
    """The A/B's shards on one device: succeeded, in the order they were cut (`before`: only those cut before it)."""
    return [AbShard(s.forward, _rate(s)) for s in job.shards
            if s.state is ShardState.SUCCEEDED and s.node_id == node_id and s.device == device
            and (before is None or s.index < before)]


def _rate(shard: Shard) -> ShardRate:
    return ShardRate(shard.items, shard.seconds, shard.marginal_j)


def shard_done(store: Store, job_id: str, index: int, outcome: TuningOutcome | None) -> None:
    """A shard succeeded (stored already): its tuning outcome in the job's log the first time its device reports
    one or when it tuned, its winner shared, and the A/B's verdict on its device once this shard settles it."""
    job = store.job(job_id)
    shard = job.shards[index]
    if outcome is None and not any(s.forward for s in job.shards):
        return  # no tuner ran, and no winner yet: no A/B underway
    spec = parse_spec(job.spec_yaml)
    if not isinstance(spec, InferenceSpec) or spec.tune_budget_s is None:
        return
    objective = objective_for(spec.policy)
    where = f"{shard.node_name or shard.node_id} {shard.device}"
    on_device = [s for s in job.shards if s.node_id == shard.node_id and s.device == shard.device
                 and s.state is ShardState.SUCCEEDED]
    if outcome is not None:
        first = not any(TUNING_S in s.metrics for s in on_device if s.index != index)
        if first or outcome.tuning_s > 0:
            store.log(job_id, "info", TUNING + where + ": " + describe_outcome(outcome), index)
        if shareable(outcome):
            store.put_winner(SharedWinner(winner_key(job, spec, outcome), outcome.winner, outcome.params), job_id)
    min_items = ab_min_items(job.items)
    before = ab_verdict([AbShard(s.forward, _rate(s)) for s in on_device if s.index != index], objective, min_items)
    after = ab_verdict(ab_shards(job, shard.node_id, shard.device), objective, min_items)
    if before.state in (AbState.KEPT, AbState.REVERTED) or after.state not in (AbState.KEPT, AbState.REVERTED):
        return
    spent_s = sum(s.metrics.get(TUNING_S, 0.0) for s in on_device)
    joules = [s.metrics[TUNING_J] for s in on_device if TUNING_J in s.metrics]
    store.log(job_id, "info" if after.state is AbState.KEPT else "warning",
              TUNING + where + ": " + describe_verdict(after, objective, spent_s, sum(joules) if joules else None))
    if after.state is AbState.REVERTED and outcome is not None and shareable(outcome):
        store.drop_winner(winner_key(job, spec, outcome))


def winner_key(job: Job, spec: InferenceSpec, outcome: TuningOutcome) -> WinnerKey:
    """The farm's key of a node's winner: what it measured on (its report, checked) and the job's model key,
    tolerance and objective (the head's own, never the node's word)."""
    return WinnerKey(device_name=outcome.device_name, driver=outcome.driver, torch_version=outcome.torch_version,
                     model_key=job.model_key, input_shapes=outcome.input_shapes, atol=spec.tolerance.atol,
                     rtol=spec.tolerance.rtol, objective=objective_for(spec.policy))


def describe_outcome(outcome: TuningOutcome) -> str:
    """One shard's forward and its tuning, in words."""
    ran = f"runs {outcome.winner}" if outcome.winner else "runs the model untuned"
    cost = ""
    if outcome.tuning_s > 0:
        cost = f"; the tuning took {outcome.tuning_s:.1f} s"
        cost += f" and {outcome.tuning_j:,.0f} J above idle" if outcome.tuning_j is not None else \
            " (its joules not measured: no energy counter)"
        if spent := [c.seconds for c in outcome.candidates if c.seconds is not None]:
            rest = max(outcome.tuning_s - sum(spent), 0.0)
            cost += (f", {rest:.1f} s of it outside its candidates (saving and analysing the model, the idle draw, "
                     "the evaluator's start)")
    measured = ("; its candidates, per call: " + "; ".join(c.describe() for c in outcome.candidates)
                if outcome.candidates else "")
    return f"{ran} ({outcome.reason or 'no reason given'}){cost}{measured}"


def describe_verdict(verdict: AbVerdict, objective: Objective, tuning_s: float, tuning_j: float | None) -> str:
    """The A/B's verdict in words: the winner against eager in the job's own shards, and when it paid off."""
    speed = verdict.gain(Objective.TIME)
    per_j = verdict.gain(Objective.ENERGY)
    figures = (f"{_times(speed)} rows/s and {_times(per_j)} items per joule above idle against eager in this job's "
               f"shards ({verdict.eager.rows:,} eager items, {verdict.tuned.rows:,} on the winner)")
    name = verdict.winner or "the winner"
    if verdict.state is AbState.REVERTED:
        lost = "slower" if speed is not None and speed < 1 else "costlier per item" if per_j is not None and \
            per_j < 1 else "no better"
        return (f"{name} reverted: it was {lost} ({figures}); eager runs the rest of the job's shards here, "
                f"which cost the tuning's {tuning_s:.1f} s" + (f" and {tuning_j:,.0f} J" if tuning_j is not None
                                                              else ""))
    items = paid_off_items(verdict, tuning_s, tuning_j, objective)
    unit = "joules" if objective is Objective.ENERGY and tuning_j is not None else "seconds"
    paid = (f"it pays back its tuning ({tuning_s:.1f} s" + (f", {tuning_j:,.0f} J" if tuning_j is not None else "")
            + f") in {unit} after {items:,.0f} items" if items is not None else "it saves nothing per item")
    return f"{name} kept: {figures}; {paid}"


def _times(gain: float | None) -> str:
    return f"{gain:.2f}x" if gain is not None else "-"
