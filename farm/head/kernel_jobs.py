"""Kernel-eval jobs on the head: their pairs and shards at intake, a shard's task at launch, and their output — one
JSON-lines file per shard as it comes in, then results.jsonl, results.csv and manifest.json once every shard is in.
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from farm.core.kernels import COLUMNS, KernelEvalTask, KernelPair, KernelResult, kernel_pairs, kernel_shard_ranges
from farm.core.spec import JobSpec
from farm.head.output import _atomic_write
from farm.head.store import Job

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"


def shard_rows_file(index: int) -> str:
    return f"shard-{index:05d}.jsonl"


def plan(spec: JobSpec, names: set[str]) -> tuple[list[KernelPair], list[tuple[int, int]]]:
    """The job's pairs (its items) and the shards over them."""
    section = spec.kernel_eval
    if section is None:  # parse_spec refuses a kernel-eval spec without it
        raise ValueError("not a kernel-eval spec")
    pairs = kernel_pairs(names, section.problems, section.candidates)
    return pairs, kernel_shard_ranges(pairs, section.candidates_per_shard)


@lru_cache(maxsize=64)
def _pairs(code_path: str, problems: str, candidates: str) -> tuple[KernelPair, ...]:
    with zipfile.ZipFile(code_path) as archive:
        return tuple(kernel_pairs(archive.namelist(), problems, candidates))


def task(job: Job, spec: JobSpec, index: int, backend: str, device: str) -> KernelEvalTask:
    section = spec.kernel_eval
    if section is None:
        raise ValueError("not a kernel-eval spec")
    shard = job.shards[index]
    pairs = _pairs(job.code_path, section.problems, section.candidates)[shard.start : shard.stop]
    return KernelEvalTask(
        job_id=job.id, index=index, pairs=pairs, backend=backend, device=device, reward=section.reward,
        margin=section.margin, timeout_s=section.timeout_s, memory_mb=section.memory_mb, runs=section.runs,
        atol=spec.tolerance.atol, rtol=spec.tolerance.rtol,
    )


def write_rows(output: Path, index: int, rows: list[KernelResult], node: str) -> None:
    text = "".join(json.dumps({**r.to_dict(), "node": node}) + "\n" for r in rows)
    _atomic_write(output / shard_rows_file(index), text.encode())


def finish(output: Path, job: Job, metrics: dict[str, float]) -> None:
    """Join the shards' rows into results.jsonl and results.csv, then the manifest (written last: its presence says
    the rest is complete)."""
    rows: list[dict[str, Any]] = []
    for shard in sorted(job.shards, key=lambda s: s.start):
        rows += [json.loads(line) for line in (output / shard_rows_file(shard.index)).read_text().splitlines() if line]
    _atomic_write(output / RESULTS_JSONL, "".join(json.dumps(r) + "\n" for r in rows).encode())
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    _atomic_write(output / RESULTS_CSV, table.getvalue().encode())
    correct = sum(bool(r["correct"]) for r in rows)
    manifest = {
        "job_id": job.id, "name": job.name, "kind": "kernel-eval", "items": job.items, "metrics": metrics,
        "format": "jsonl", "results": RESULTS_JSONL, "table": RESULTS_CSV, "correct": correct,
        "shards": [
            {"index": s.index, "start": s.start, "stop": s.stop, "file": shard_rows_file(s.index), "node": s.node_name,
             "backend": s.backend, "device": s.device, "seconds": s.seconds, "energy_j": s.energy_j,
             "energy_source": s.energy_source, "energy_scope": s.energy_scope}
            for s in job.shards
        ],
    }
    _atomic_write(output / "manifest.json", json.dumps(manifest, indent=2).encode())
