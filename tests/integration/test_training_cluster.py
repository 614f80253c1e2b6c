"""Training jobs end to end: a real head, its Ray cluster and real agents, through `farm submit`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from farm.client import Client
from tests.conftest import FIXTURES, ROOT, Cluster
from tests.integration.test_cluster import kill_hard, write_spec

pytestmark = pytest.mark.slow


def test_the_digits_cnn_trains_on_two_agents_to_the_examples_bar(cluster: Cluster, tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "examples/digits/train.yaml").read_text())
    spec["output"] = str(tmp_path / "out")
    result = cluster.farm("submit", str(write_spec(tmp_path, **spec)), "--wait", "--json", "--workdir", str(ROOT))
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "succeeded" and job["kind"] == "training"
    assert job["metrics"]["accuracy"] >= 0.95 and job["metrics"]["step"] == 157  # 8 epochs of 1257 at 64
    assert all(" + " in s["node_name"] for s in job["shards"])  # both agents trained every stretch
    assert {s["energy_source"] for s in job["shards"]} == {"model-estimate"} and job["metrics"]["items_per_j"] > 0
    output = Path(job["output"])
    from examples.digits.model import build

    build().load_state_dict(torch.load(output / "model.pt", weights_only=True))  # the final model loads
    assert json.loads((output / "_manifest.json").read_text())["steps"] == 157
    with Client(cluster.head) as client:
        logs = [line.message for line in client.logs(job["id"])]
    assert any(m.startswith("workers: ") and "samples/s measured" in m for m in logs)
    assert sum(m.startswith("step ") for m in logs) == 157


def test_training_resumes_from_its_checkpoint_when_a_worker_node_is_lost(cluster: Cluster, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "jobs" / "toytrain.py", work / "toytrain.py")
    started = cluster.farm("agent", "start", "--head", cluster.head.address, "--token", cluster.head.join_token,
                           "--name", "agent-t", "--cpus", "1", "--state-dir", str(cluster.state_dir), "--detach",
                           "--max-foreign-cpu", "100", "--trusted")  # training runs on trusted nodes only
    assert started.returncode == 0, started.stderr
    spec = write_spec(work, name="resumable", kind="training", model="toytrain:build", dataset="toytrain:train_set",
                      batch_size=48, backends=["cpu"], output=str(tmp_path / "out"),
                      training={"optimizer": "sgd", "lr": 0.05, "steps": 120, "workers": 3, "checkpoint_every": 20,
                                "eval_dataset": "toytrain:test_set"})
    job_id = cluster.farm("submit", str(spec), "--workdir", str(work)).stdout.strip()
    with Client(cluster.head) as client:
        for record in client.watch(job_id):
            if record.shards[0].state == "succeeded" and "agent-t" in record.shards[1].node_name:
                break
        kill_hard(cluster.state_dir / "agents" / "agent-t" / "agent.json")
        final = list(client.watch(job_id))[-1]
        logs = [line.message for line in client.logs(job_id)]
    assert final.state == "succeeded", final.error
    assert any("resuming at step" in m for m in logs)
    assert "agent-t" not in final.shards[-1].node_name
    assert final.metrics["accuracy"] >= 0.9


def test_a_cancelled_training_job_gives_its_devices_back(cluster: Cluster, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "jobs" / "toytrain.py", work / "toytrain.py")
    spec = write_spec(work, name="cancelled", kind="training", model="toytrain:build", dataset="toytrain:train_set",
                      batch_size=32, backends=["cpu"], output=str(tmp_path / "out"),
                      training={"steps": 100_000, "workers": 2, "checkpoint_every": 50})
    job_id = cluster.farm("submit", str(spec), "--workdir", str(work)).stdout.strip()
    with Client(cluster.head) as client:
        for record in client.watch(job_id):
            if record.shards[0].state == "succeeded":  # training for real: its workers hold both agents' slots
                break
        assert client.cancel(job_id).state == "cancelled"
    # The workers are gone: an inference job on the same two agents gets their slots and finishes.
    infer = write_spec(work, name="after", model="toytrain:build", dataset="toytrain:test_set", shards=2,
                       output=str(tmp_path / "after"))
    result = cluster.farm("submit", str(infer), "--wait", "--json", "--workdir", str(work), timeout=180)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "succeeded"


def test_what_a_training_worker_printed_is_in_the_stretchs_log(cluster: Cluster, tmp_path: Path) -> None:
    """As an inference shard's: `farm logs ID --shard N` shows what each worker printed during stretch N (its
    model's construction before the first), and a failed stretch its traceback."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("toytrain.py", "noisytrain.py"):
        shutil.copy(FIXTURES / "jobs" / name, work / name)
    common = {"kind": "training", "model": "noisytrain:build", "dataset": "noisytrain:train_set", "batch_size": 32,
              "backends": ["cpu"]}
    spec = write_spec(work, name="noisy", output=str(tmp_path / "out"), **common,
                      training={"optimizer": "sgd", "lr": 0.05, "steps": 20, "workers": 1, "checkpoint_every": 10})
    result = cluster.farm("submit", str(spec), "--wait", "--json", "--workdir", str(work), "--no-check")
    assert result.returncode == 0, result.stderr
    job_id = json.loads(result.stdout)["id"]
    first = cluster.farm("logs", job_id, "--shard", "0")
    assert first.returncode == 0, first.stderr
    assert "building the noisy model in pid" in first.stdout and "warning: this model is noisy" in first.stdout
    assert "forward call 10 on 32 rows" in first.stdout
    second = cluster.farm("logs", job_id, "--shard", "1").stdout
    assert "forward call 20 on 32 rows" in second and "building the noisy model" not in second

    failing = write_spec(work, name="noisy-fails", output=str(tmp_path / "fails"), **common,
                         training={"steps": 10, "workers": 1, "loss": "noisytrain:failing_loss"})
    result = cluster.farm("submit", str(failing), "--wait", "--json", "--workdir", str(work), "--no-check")
    assert result.returncode == 1, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "failed" and "the loss does not take these targets" in job["error"]
    logs = cluster.farm("logs", job["id"], "--shard", "0").stdout
    assert "computing a loss that cannot be computed" in logs
    assert "Traceback (most recent call last)" in logs and "in failing_loss" in logs
