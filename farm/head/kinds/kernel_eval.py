"""`kind: kernel-eval`: folders of problems and candidates judged by the hardened evaluator. Items are (problem,
candidate) pairs found in the job's code; a shard holds one problem's candidates. Each shard's rows are one JSON-lines
file as they come in; the end joins them into results.jsonl and results.csv."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.core.kernels import (
    COLUMNS, KernelEvalTask, KernelPair, KernelResult, kernel_pairs, kernel_shard_ranges,
)
from farm.core.models import BackendName, Shard
from farm.core.spec import JobKind, KernelEvalSpec
from farm.data.results import Results
from farm.head import arrivals, output_place, shard_check
from farm.head.arrivals import Arrival, figures
from farm.head.kinds.base import Plan, ShardCall, ShardedKind, Submission
from farm.head.outcomes import ShardRecord
from farm.head.output import atomic_write
from farm.head.shard_check import ShardResultError
from farm.head.store import Job

if TYPE_CHECKING:
    from farm.scheduler import Assignment

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"


def shard_rows_file(index: int) -> str:
    return f"shard-{index:05d}.jsonl"


class KernelEval(ShardedKind[KernelEvalSpec]):
    kind = JobKind.KERNEL_EVAL

    def plan(self, spec: KernelEvalSpec, submission: Submission) -> Plan:
        section = spec.kernel_eval
        pairs = kernel_pairs(submission.names, section.problems, section.candidates)
        # Only the same pairs time alike: calibration is keyed by the code itself.
        key = hashlib.sha256(b"kernel-eval\0" + submission.code_zip).hexdigest()[:16]
        return Plan(len(pairs), kernel_shard_ranges(pairs, section.candidates_per_shard), key)

    def backends(self, spec: KernelEvalSpec) -> tuple[BackendName, ...]:
        return spec.kernel_eval_backends

    def task(self, job: Job, spec: KernelEvalSpec, shard: Shard, assignment: Assignment) -> ShardCall:
        section = spec.kernel_eval
        pairs = _pairs(job.code_path, section.problems, section.candidates)[shard.start : shard.stop]
        return ShardCall("run_kernel_shard", KernelEvalTask(
            job_id=job.id, index=shard.index, pairs=pairs, backend=assignment.backend.value, device=assignment.device,
            reward=section.reward, margin=section.margin, timeout_s=section.timeout_s, memory_mb=section.memory_mb,
            runs=section.runs, atol=spec.tolerance.atol, rtol=spec.tolerance.rtol,
        ))

    def staging(self, job: Job, index: int) -> Path:
        """Its rows arrive as a table (farm_agent.work.kinds.kernel_eval.rows_table), staged hidden in the job's
        folder."""
        output_place.recheck(job.output, self.settings)  # a link swapped in since submit: not written through
        shard = job.shards[index]  # its upload is refused past its range's rows (farm.head.arrivals)
        return arrivals.bounded(Results(job.output).staging(index), shard.stop - shard.start)

    def record(self, job: Job, spec: KernelEvalSpec, shard: Shard, result: Arrival) -> ShardRecord:
        """Its rows, named by the node that measured them."""
        found = figures(result)
        if result.table is None:
            raise ShardResultError("its result carries no rows")
        try:
            rows = [KernelResult.from_dict(row) for row in result.table.table().to_pylist()]
        except TypeError as exc:
            raise ShardResultError(f"its rows are not kernel results: {exc}") from None
        finally:
            result.table.discard()
        shard_check.check(shard, found.items, len(rows))
        output_place.recheck(job.output, self.settings)
        write_rows(Path(job.output), shard.index, rows, shard.node_name)
        return ShardRecord(found.items, found.seconds, found.correct, found.energy, found.peak_memory_bytes)

    def finish(self, job: Job, spec: KernelEvalSpec, metrics: dict[str, float]) -> dict[str, Any]:
        """Join the shards' rows into results.jsonl and results.csv."""
        output = Path(job.output)
        rows: list[dict[str, Any]] = []
        for shard in sorted(job.shards, key=lambda s: s.start):
            text = (output / shard_rows_file(shard.index)).read_text()
            rows += [json.loads(line) for line in text.splitlines() if line]
        atomic_write(output / RESULTS_JSONL, "".join(json.dumps(r) + "\n" for r in rows).encode())
        table = io.StringIO()
        writer = csv.DictWriter(table, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(output / RESULTS_CSV, table.getvalue().encode())
        return {"format": "jsonl", "results": RESULTS_JSONL, "table": RESULTS_CSV,
                "correct": sum(bool(r["correct"]) for r in rows)}

    def shard_file(self, index: int) -> str | None:
        return shard_rows_file(index)


@lru_cache(maxsize=64)
def _pairs(code_path: str, problems: str, candidates: str) -> tuple[KernelPair, ...]:
    with zipfile.ZipFile(code_path) as archive:
        return tuple(kernel_pairs(archive.namelist(), problems, candidates))


def write_rows(output: Path, index: int, rows: list[KernelResult], node: str) -> None:
    text = "".join(json.dumps({**r.to_dict(), "node": node}) + "\n" for r in rows)
    atomic_write(output / shard_rows_file(index), text.encode())
