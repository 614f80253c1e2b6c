"""A job's output folder: every file written atomically (fsynced, then renamed), and manifest.json, of one shape for
every kind, written last once every shard is in. Inference's own files (one .npy per shard) are here too."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from farm.head.store import Job


def shard_file(index: int) -> str:
    return f"shard-{index:05d}.npy"


MANIFEST = "manifest.json"
# How the temporary files of unfinished writes start (".shard-00007.npy.k3j_a9", ".manifest.json.x81q"): hidden, and
# never a finished file's name.
PARTIAL_PREFIXES = (".shard-", f".{MANIFEST}.")


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)  # readers see the whole file or none of it
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_shard(output: Path, index: int, outputs: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, outputs, allow_pickle=False)
    atomic_write(output / shard_file(index), buffer.getvalue())


def write_manifest(output: Path, manifest: dict[str, Any]) -> None:
    atomic_write(output / MANIFEST, json.dumps(manifest, indent=2).encode())


def manifest(job: Job, metrics: dict[str, float], fields: dict[str, Any],
             shard_file: Callable[[int], str | None]) -> dict[str, Any]:
    """The manifest of any kind: the job, its metrics, the kind's own fields, then each shard once (its file, where
    the kind writes one per shard)."""
    shards = []
    for s in job.shards:
        file = shard_file(s.index)
        shards.append({
            "index": s.index, "start": s.start, "stop": s.stop, **({"file": file} if file else {}),
            "node": s.node_name, "backend": s.backend, "device": s.device, "seconds": s.seconds,
            "energy_j": s.energy_j, "energy_source": s.energy_source, "energy_scope": s.energy_scope,
        })
    return {"job_id": job.id, "name": job.name, "kind": job.kind, "items": job.items, "metrics": metrics, **fields,
            "shards": shards}


def remove_partial_files(output: Path) -> int:
    """Remove the temporary files of writes that never finished (a head killed mid-write); how many. Only for a job
    with no write in flight: at the head's start, before it runs anything."""
    if not output.is_dir():
        return 0
    partial = [p for p in output.iterdir() if p.name.startswith(PARTIAL_PREFIXES) and p.is_file()]
    for path in partial:
        path.unlink(missing_ok=True)
    return len(partial)


def read_predictions(output: Path) -> np.ndarray:
    """Every shard's outputs joined back in input order, as the manifest lists them."""
    manifest = json.loads((output / MANIFEST).read_text())
    parts = sorted(manifest["shards"], key=lambda s: s["start"])
    return np.concatenate([np.load(output / part["file"], allow_pickle=False) for part in parts])
