"""`kind: evaluate`: a model scored over a labelled dataset, shard by shard as inference runs it; each shard sends
its accuracy count and mean loss (its figures, no table), and the job reports both per device and over all. It writes
no outputs (the manifest alone, with the per-device table)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from farm.core.models import Shard
from farm.core.spec import EvaluateSpec, JobKind
from farm.core.tasks import EvaluateTask
from farm.head.arrivals import Arrival, figures
from farm.head.kinds.base import Plan, ShardCall, ShardedKind, Submission
from farm.head.kinds.inference import plan_rows, shard_task
from farm.head.shard_check import ShardResultError
from farm.head.outcomes import ShardRecord
from farm.head.store import Job

if TYPE_CHECKING:
    from farm.scheduler import Assignment


class Evaluate(ShardedKind[EvaluateSpec]):
    kind = JobKind.EVALUATE

    def plan(self, spec: EvaluateSpec, submission: Submission) -> Plan:
        return plan_rows(spec, submission, spec.shards)

    def task(self, job: Job, spec: EvaluateSpec, shard: Shard, assignment: Assignment) -> ShardCall:
        return ShardCall("run_evaluate_shard", EvaluateTask(shard_task(job, spec, shard, assignment), spec.loss))

    def check_result(self, job: Job, spec: EvaluateSpec, shard: Shard, result: Arrival) -> None:
        super().check_result(job, spec, shard, result)
        if "loss" not in figures(result).metrics:
            raise ShardResultError("its result has no loss")

    def record(self, job: Job, spec: EvaluateSpec, shard: Shard, result: Arrival) -> ShardRecord:
        found = figures(result)
        return ShardRecord(found.items, found.seconds, found.correct, found.energy, found.peak_memory_bytes,
                           metrics={"loss": found.metrics["loss"],
                                    **({"correct": found.correct} if found.correct is not None else {})})

    def metrics(self, job: Job, spec: EvaluateSpec) -> dict[str, float]:
        """The loss over all rows, then accuracy and loss per device ("accuracy@node/device")."""
        found: dict[str, float] = {"loss": _mean_loss(job.shards)}
        for device, shards in _by_device(job.shards).items():
            found[f"loss@{device}"] = _mean_loss(shards)
            accuracy = _accuracy(shards)
            if accuracy is not None:
                found[f"accuracy@{device}"] = accuracy
        return found

    def finish(self, job: Job, spec: EvaluateSpec, metrics: dict[str, float]) -> dict[str, Any]:
        devices = []
        for device, shards in _by_device(job.shards).items():
            devices.append({"device": device, "items": sum(s.items for s in shards), "loss": _mean_loss(shards),
                            "accuracy": _accuracy(shards), "seconds": sum(s.seconds for s in shards),
                            "energy_j": sum(s.energy_j for s in shards)})
        return {"format": "none", "loss": spec.loss, "devices": devices}


def _by_device(shards: Sequence[Shard]) -> dict[str, list[Shard]]:
    grouped: defaultdict[str, list[Shard]] = defaultdict(list)
    for shard in shards:
        grouped[f"{shard.node_name}/{shard.device}"].append(shard)
    return dict(sorted(grouped.items()))


def _mean_loss(shards: Sequence[Shard]) -> float:
    """Each shard's mean loss weighted by its rows."""
    items = sum(s.items for s in shards)
    return sum(s.metrics["loss"] * s.items for s in shards) / items if items else 0.0


def _accuracy(shards: list[Shard]) -> float | None:
    """Predictions that hit their label over the rows; None where the outputs are not class scores."""
    if not all("correct" in s.metrics for s in shards):
        return None
    items = sum(s.items for s in shards)
    return sum(s.metrics["correct"] for s in shards) / items if items else None
