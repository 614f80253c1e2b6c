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
    # Each device's first shard measures it (4 batches); then none is more than 4x the largest it ran before, or
    # 1/4 of its floor at its measured speed where that is more (a toy model's shards of 64 rows last a millisecond:
    # its placement says so), and a tail's share, cut into a queue slot while the shard before it ran, may be
    # smaller than the one after it.
    placed = {line["message"].split(" → ")[0].split()[-1]: line["message"] for line in
              json.loads(cluster.farm("logs", job["id"], "--json").stdout) if " → " in line["message"]}
    for node in {s["node_name"] for s in shards}:
        mine = [s for s in sorted(job["shards"], key=lambda s: s["index"]) if s["node_name"] == node]
        sizes = [int(s["stop"]) - int(s["start"]) for s in mine]
        assert sizes[0] == 4 * BATCH, sizes
        for i, shard in enumerate(mine[1:], 1):
            why = placed[str(shard["index"])]
            assert sizes[i] <= 4 * max(sizes[:i]) or "1/4 of its floor" in why, (sizes, why)
    assert len(shards) >= 3
    # No RAPL here: the model estimate's idle draw is 0 by construction, so its energy above idle is its total.
    assert all(s["marginal_j"] == pytest.approx(s["energy_j"]) for s in shards)
    assert job["marginal_j"] == pytest.approx(job["energy_j"])
    explained = cluster.farm("job", job["id"], "--explain")
    assert explained.returncode == 0, explained.stderr
    words = " ".join(explained.stdout.split())  # as printed, wrapped to the terminal's width
    assert "shard sizes per device" in words
    # Both agents measured from the start (a job this small is less than a second of work: at the tail one may sit
    # out, its share too short).
    assert all(f"agent-{x}/cpu: {4 * BATCH}" in words for x in "ab"), words
    assert f": {4 * BATCH} rows (4 batches): its first shard of this model measures it" in words
    nodes = json.loads(cluster.farm("nodes", "--json").stdout)
    assert all((b["idle_w"], b["idle_source"], b["meter_step_s"]) == (0.0, "model-estimate", 0.0)
               for n in nodes for b in n["backends"])
