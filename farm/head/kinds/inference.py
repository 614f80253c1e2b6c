"""`kind: inference`: a model over a dataset's rows, shard by shard; each shard's outputs one Parquet file.

The dataset is a callable or a file in the job's code (loaded whole on the node), or a location and format: the data
seam (farm.data) plans it here at submit from its metadata, and each shard's task carries the plan's slice holding
its range, which the node streams batch by batch (through the head's DataService for a path on this machine).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.core.errors import SpecError
from farm.core.models import Shard, ShardState
from farm.core.spec import InferenceSpec, JobKind, ModelJobSpec, shard_ranges
from farm.core.phases import ShardPhases
from farm.core.dataset import READ_ROUTE, ROW_ID, ReadRoute, Unit
from farm.core.tasks import DataTask, ShardTask, Tuning
from farm.core.tuning import objective_for
from farm.data.batches import concat
from farm.data.results import FORMAT, Results, shard_file
from farm.head import arrivals, autoshard, datasets, output_place, shard_check, tuning
from farm.head.arrivals import Arrival, figures
from farm.head.kinds.base import Plan, ShardCall, ShardedKind, Submission, check_model_files, model_key
from farm.head.outcomes import ShardRecord
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
               tune_budget_s: float | None = None, data: DataTask | None = None) -> ShardTask:
    """The model over one shard's rows on the assignment's device (`data`: the slice of a located dataset)."""
    return ShardTask(
        job_id=job.id, index=shard.index, start=shard.start, stop=shard.stop, model=spec.model, weights=spec.weights,
        dataset=spec.dataset if isinstance(spec.dataset, str) else "", batch_size=spec.batch_size,
        backend=assignment.backend.value, device=assignment.device, threads=assignment.threads, data=data,
        tuning=Tuning(atol=spec.tolerance.atol, rtol=spec.tolerance.rtol, budget_s=tune_budget_s,
                      objective=objective_for(spec.policy), rows_left=rows_left(job, data)),
    )


def rows_left(job: Job, data: DataTask | None) -> int | None:
    """The job's units not in a finished shard: the rows a tuning run started now could still save on (None where
    the units are bytes of line files, whose rows are not counted before they are read)."""
    if data is not None and data.plan.unit is Unit.BYTES:
        return None
    return max(job.items - sum(s.stop - s.start for s in job.shards if s.state is ShardState.SUCCEEDED), 0)


class Inference(ShardedKind[InferenceSpec]):
    kind = JobKind.INFERENCE

    def plan(self, spec: InferenceSpec, submission: Submission) -> Plan:
        located = spec.located_dataset
        if located is None:
            return plan_rows(spec, submission, spec.fixed_shards)
        check_model_files(spec, submission.names)
        located, plan = datasets.plan_located(located, submission.dataset_location, self.settings.state_dir)
        # Ranges count the plan's units: rows, or bytes of line files (whose rows are counted as they are read).
        ranges = shard_ranges(plan.size, spec.fixed_shards) if spec.fixed_shards else []
        return Plan(plan.size, ranges, model_key(spec, submission.code_zip), keep=datasets.files(located, plan),
                    notes=(datasets.describe(located, plan),))

    def sizes_shards(self, spec: InferenceSpec) -> bool:
        return spec.auto_shards

    def counts_bytes(self, job: Job, spec: InferenceSpec) -> bool:
        saved = datasets.load(self.settings.state_dir, job.id)
        return saved is not None and saved[1].unit is Unit.BYTES

    def complete(self, job: Job, spec: InferenceSpec) -> bool:
        return not spec.auto_shards or autoshard.complete(job)

    def task(self, job: Job, spec: InferenceSpec, shard: Shard, assignment: Assignment) -> ShardCall:
        data = None
        saved = datasets.load(self.settings.state_dir, job.id)
        if saved is not None:
            located, plan = saved
            data = DataTask(spec=located, plan=plan.slice(shard.start, shard.stop),
                            access=datasets.access(self.settings, job.id))
        task = shard_task(job, spec, shard, assignment, spec.tune_budget_s, data)
        if self.store is not None:  # the A/B's side on this device, the winners the farm shares
            task = replace(task, tuning=tuning.shard_tuning(self.store, job, spec, assignment.node_id,
                                                            assignment.device, task.tuning))
        return ShardCall("run_shard", task)

    def staging(self, job: Job, index: int) -> Path:
        output_place.recheck(job.output, self.settings)  # a link swapped in since submit: not written through
        shard = job.shards[index]  # its upload is refused past its range's rows (farm.head.arrivals)
        return arrivals.bounded(Results(job.output).staging(index), shard.stop - shard.start)

    def check_result(self, job: Job, spec: InferenceSpec, shard: Shard, result: Arrival) -> None:
        rows, ids = (result.table.rows, result.table.column(ROW_ID)) if result.table else (0, None)
        shard_check.check_table(shard, figures(result).items, rows, ids, self.counts_bytes(job, spec))

    def measured(self, result: Arrival) -> ShardRecord:
        found = figures(result)
        route = ReadRoute.of(found.metrics)  # for `farm job --explain`: which way the node's data came
        metrics = {READ_ROUTE: float(route)} if route is not None else {}
        phases = ShardPhases.of(found.metrics, found.seconds)  # where its time went: bounded, it is a node's
        if phases is not None:
            metrics.update(phases.metrics())
        if found.tuning is not None:  # what its node spent tuning before it (the A/B's break-even counts it)
            metrics[tuning.TUNING_S] = found.tuning.tuning_s
            if found.tuning.tuning_j is not None:
                metrics[tuning.TUNING_J] = found.tuning.tuning_j
        return ShardRecord(found.items, found.seconds, found.correct, found.energy, found.peak_memory_bytes,
                           metrics=metrics, tuning=found.tuning)

    def record(self, job: Job, spec: InferenceSpec, shard: Shard, result: Arrival) -> ShardRecord:
        output_place.recheck(job.output, self.settings)
        results = Results(job.output)
        if result.table is None:  # no rows (a byte range holding no line start): an empty file all the same
            results.write_table(shard.index, concat([]))
        else:
            results.commit_shard(shard.index, result.table.path)
        return self.measured(result)

    def finish(self, job: Job, spec: InferenceSpec, metrics: dict[str, float]) -> dict[str, Any]:
        return {"format": FORMAT}

    def shard_file(self, index: int) -> str | None:
        return shard_file(index)
