"""Auto-sized shards and marginal energy on the shared cluster: a real head, Ray and two agents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from farm.data.results import read_predictions
from tests.conftest import FIXTURES, Cluster

pytestmark = pytest.mark.slow

ROWS = 60_000
BATCH = 16  # its own batch size: no other test's measurements of this model apply (calibration is keyed by it)


@pytest.fixture()
def many(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", work / "toyjob.py")
    np.save(work / "many.npy", np.arange(ROWS * 2, dtype=np.float32).reshape(ROWS, 2))
    return work


def test_an_auto_sized_job_starts_small_grows_and_covers_every_row_once(cluster: Cluster, many: Path) -> None:
    spec = many / "auto.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "auto", "model": "toyjob:doubler", "dataset": "many.npy", "shards": "auto", "batch_size": BATCH,
        "backends": ["cpu"], "policy": "throughput", "output": str(many / "out")}))
    result = cluster.farm("submit", str(spec), "--wait", "--json", "--workdir", str(many))
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "succeeded" and job["items"] == ROWS
    shards = sorted(job["shards"], key=lambda s: int(s["start"]))
    # Cut as the job ran: contiguous, every row in exactly one shard, every shard done once.
    assert [int(s["start"]) for s in shards] == [0] + [int(s["stop"]) for s in shards[:-1]]
    assert int(shards[-1]["stop"]) == ROWS and all(s["state"] == "succeeded" for s in shards)
    np.testing.assert_array_equal(read_predictions(Path(job["output"])),
                                  np.arange(ROWS * 2, dtype=np.float32).reshape(ROWS, 2) * 2)
    # Each device's first shard measures it (4 batches); then none is more than 4x the largest it ran before (a
    # tail's share, cut into a queue slot while the shard before it ran, may be smaller than the one after it).
    for node in {s["node_name"] for s in shards}:
        sizes = [int(s["stop"]) - int(s["start"]) for s in sorted(job["shards"], key=lambda s: s["index"])
                 if s["node_name"] == node]
        assert sizes[0] == 4 * BATCH, sizes
        assert all(size <= 4 * max(sizes[:i]) for i, size in enumerate(sizes) if i), str(sizes)
    assert len(shards) >= 4
    # No RAPL here: the model estimate's idle draw is 0 by construction, so its energy above idle is its total.
    assert all(s["marginal_j"] == pytest.approx(s["energy_j"]) for s in shards)
    assert job["marginal_j"] == pytest.approx(job["energy_j"])
    explained = cluster.farm("job", job["id"], "--explain")
    assert explained.returncode == 0, explained.stderr
    words = " ".join(explained.stdout.split())  # as printed, wrapped to the terminal's width
    assert "shard sizes per device" in words
    # Both agents measured from the start; their shards grew 4x at a time. A device's worker holds its next shard
    # while one runs (queue depth 1), cut from what its last finished shard measured: a size may come twice ("256
    # x2"). (A job this small is less than a second of work: at the tail one may sit out, its share too short.)
    assert all(f"agent-{x}/cpu: {4 * BATCH}" in words for x in "ab"), words
    assert f"cpu: {4 * BATCH}, {16 * BATCH}" in words and f"{64 * BATCH:,} x2" in words, words
    assert f": {4 * BATCH} rows (4 batches): its first shard of this model measures it" in words
    nodes = json.loads(cluster.farm("nodes", "--json").stdout)
    assert all((b["idle_w"], b["idle_source"], b["meter_step_s"]) == (0.0, "model-estimate", 0.0)
               for n in nodes for b in n["backends"])
