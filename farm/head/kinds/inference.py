"""`kind: inference`: a model over a dataset's rows, shard by shard; each shard's outputs one .npy file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.core.errors import SpecError
from farm.core.models import Shard
from farm.core.spec import InferenceSpec, JobKind, ModelJobSpec, shard_ranges
from farm.core.tasks import ShardResult, ShardTask, Tuning
from farm.head import autoshard, remote
from farm.head.kinds.base import Plan, ShardCall, ShardedKind, Submission, check_model_files, model_key
from farm.head.outcomes import ShardRecord
from farm.head.output import shard_file, write_shard
from farm.head.store import Job

if TYPE_CHECKING:
    from farm.scheduler import Assignment


def plan_rows(spec: ModelJobSpec, submission: Submission, shards: int) -> Plan:
    """A model job over the rows the client counted: `shards` near-equal shards of them (0: none yet, for a job whose
    shards are cut as it runs)."""
    if submission.items < 1:
        raise SpecError("the dataset is empty")
    check_model_files(spec, submission.names)
    ranges = shard_ranges(submission.items, shards) if shards else []
    return Plan(submission.items, ranges, model_key(spec, submission.code_zip))


def shard_task(job: Job, spec: ModelJobSpec, shard: Shard, assignment: Assignment,
               tune_budget_s: float | None = None) -> ShardTask:
    """The model over one shard's rows on the assignment's device."""
    return ShardTask(
        job_id=job.id, index=shard.index, start=shard.start, stop=shard.stop, model=spec.model, weights=spec.weights,
        dataset=spec.dataset, batch_size=spec.batch_size, backend=assignment.backend.value, device=assignment.device,
        threads=assignment.threads,
        tuning=Tuning(atol=spec.tolerance.atol, rtol=spec.tolerance.rtol, budget_s=tune_budget_s),
    )


class Inference(ShardedKind[InferenceSpec]):
    kind = JobKind.INFERENCE

    def plan(self, spec: InferenceSpec, submission: Submission) -> Plan:
        return plan_rows(spec, submission, spec.fixed_shards)

    def sizes_shards(self, spec: InferenceSpec) -> bool:
        return spec.auto_shards

    def complete(self, job: Job, spec: InferenceSpec) -> bool:
        return not spec.auto_shards or autoshard.complete(job)

    def task(self, job: Job, spec: InferenceSpec, shard: Shard, assignment: Assignment) -> ShardCall:
        return ShardCall(remote.run_shard, shard_task(job, spec, shard, assignment, spec.tune_budget_s))

    def record(self, job: Job, spec: InferenceSpec, shard: Shard, result: ShardResult) -> ShardRecord:
        write_shard(Path(job.output), shard.index, result.outputs)
        return ShardRecord(result.items, result.seconds, result.correct, result.energy, result.peak_memory_bytes)

    def finish(self, job: Job, spec: InferenceSpec, metrics: dict[str, float]) -> dict[str, Any]:
        return {"format": "npy"}

    def shard_file(self, index: int) -> str | None:
        return shard_file(index)
