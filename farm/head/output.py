"""A job's output: one .npy file per shard, written atomically, and manifest.json once every shard is in."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def shard_file(index: int) -> str:
    return f"shard-{index:05d}.npy"


def _atomic_write(path: Path, data: bytes) -> None:
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
    _atomic_write(output / shard_file(index), buffer.getvalue())


def write_manifest(output: Path, manifest: dict[str, Any]) -> None:
    _atomic_write(output / "manifest.json", json.dumps(manifest, indent=2).encode())


def read_predictions(output: Path) -> np.ndarray:
    """Every shard's outputs joined back in input order, as the manifest lists them."""
    manifest = json.loads((output / "manifest.json").read_text())
    parts = sorted(manifest["shards"], key=lambda s: s["start"])
    return np.concatenate([np.load(output / part["file"], allow_pickle=False) for part in parts])
