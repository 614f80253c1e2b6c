"""A job's output folder: every file written atomically (fsynced, then renamed), and _manifest.json, of one shape for
every kind, written last once every shard is in. Inference's own files (Parquet, one per shard) are
farm.data.results'."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# One atomic write for every kind's files (training's checkpoints, kernel-eval's tables), and the partial files'
# names, as the data plane's results writes them.
from farm.core.models import ShardState
from farm.data.results import PARTIAL_PREFIXES, Results, atomic_write  # noqa: F401

if TYPE_CHECKING:
    from farm.head.store import Job


def write_manifest(output: Path | str, manifest: dict[str, Any]) -> None:
    """At the job's output: a folder on the head's machine, or a bucket (an inference job's `output: s3://...`)."""
    Results(str(output)).write_manifest(manifest)


def manifest(job: Job, metrics: dict[str, float], fields: dict[str, Any],
             shard_file: Callable[[int], str | None]) -> dict[str, Any]:
    """The manifest of any kind: the job, its metrics, the kind's own fields, then each shard once (its file, where
    the kind writes one per shard), and the ranges skipped because they do not read (within the job's error budget),
    each with why."""
    shards = []
    for s in job.shards:
        if s.state is not ShardState.SUCCEEDED:
            continue
        file = shard_file(s.index)
        shards.append({
            "index": s.index, "start": s.start, "stop": s.stop, **({"file": file} if file else {}),
            "node": s.node_name, "backend": s.backend, "device": s.device, "seconds": s.seconds,
            "energy_j": s.energy_j, "energy_source": s.energy_source, "energy_scope": s.energy_scope,
        })
    skipped = [{"start": s.start, "stop": s.stop, "error": s.error} for s in sorted(job.shards, key=lambda s: s.start)
               if s.state is ShardState.FAILED]
    return {"job_id": job.id, "name": job.name, "kind": job.kind, "items": job.items, "metrics": metrics, **fields,
            "shards": shards, "skipped": skipped}


def remove_partial_files(output: Path) -> int:
    """Remove the temporary files of writes that never finished (a head killed mid-write); how many. Only for a job
    with no write in flight: at the head's start, before it runs anything."""
    if not output.is_dir():
        return 0
    partial = [p for p in output.iterdir() if p.name.startswith(PARTIAL_PREFIXES) and p.is_file()]
    for path in partial:
        path.unlink(missing_ok=True)
    return len(partial)
