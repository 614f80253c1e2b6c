"""The spine end to end: a real head, a real Ray cluster and two agents as separate processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from farm.client import Client
from farm.data.results import read_predictions
from tests.conftest import FIXTURES, ROOT, Cluster

pytestmark = pytest.mark.slow


def write_spec(folder: Path, **fields: object) -> Path:
    path = folder / f"{fields['name']}.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.fixture()
def toy(tmp_path: Path) -> Path:
    """A job's working directory: the toy job code and an .npz dataset."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", work / "toyjob.py")
    np.savez(work / "numbers.npz", x=np.arange(40, dtype=np.float32).reshape(20, 2))
    return work


def test_both_agents_are_ready_with_the_contract_fields(cluster: Cluster) -> None:
    result = cluster.farm("nodes", "--json")
    assert result.returncode == 0, result.stderr
    nodes = {n["name"]: n for n in json.loads(result.stdout)}
    assert set(nodes) == {"agent-a", "agent-b"}
    for node in nodes.values():
        assert node["state"] == "ready"
        assert node["id"].startswith("n-") and node["trusted"]  # the fixture's agents are trusted (conftest)
        assert time.time() - node["last_heartbeat"] < 10
        assert [(b["name"], b["device"]) for b in node["backends"]] == [("cpu", "cpu")]
        # No RAPL here: CPU power is Farm's model estimate, and says so.
        assert [(p["device"], p["source"], p["scope"]) for p in node["power"]] == [("cpu", "model-estimate", "package")]
        assert node["hardware"]["cpu_cores"] >= 1


def test_the_digits_job_runs_across_both_agents(cluster: Cluster, tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "examples/digits/infer.yaml").read_text())
    spec["output"] = str(tmp_path / "out")
    result = cluster.farm("submit", str(write_spec(tmp_path, **spec)), "--wait", "--json", "--workdir", str(ROOT))
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "succeeded" and job["kind"] == "inference" and job["items"] == 540
    assert job["metrics"]["accuracy"] >= 0.90
    assert {s["node_name"] for s in job["shards"]} == {"agent-a", "agent-b"}
    assert all(s["state"] == "succeeded" and s["backend"] == "cpu" and s["seconds"] > 0 for s in job["shards"])
    assert all(s["device"] == "cpu" and s["peak_memory_bytes"] > 2**20 for s in job["shards"])  # a worker's RSS
    assert sum(s["items"] for s in job["shards"]) == 540
    assert {(s["energy_source"], s["energy_scope"]) for s in job["shards"]} == {("model-estimate", "package")}
    assert job["energy_sources"] == ["model-estimate"] and job["energy_j"] > 0
    assert job["metrics"]["items_per_j"] == pytest.approx(540 / job["energy_j"])

    # The shards join back in input order: the same logits as the model run here over the whole test set.
    import torch

    from examples.digits import data, model

    reference = model.build()
    reference.load_state_dict(torch.load(ROOT / "examples/digits/weights.pt", weights_only=True))
    inputs, _ = data.test_set()
    with torch.inference_mode():
        expected = reference.eval()(torch.from_numpy(inputs)).numpy()
    np.testing.assert_allclose(read_predictions(Path(job["output"])), expected, rtol=1e-4, atol=1e-4)
    manifest = json.loads((Path(job["output"]) / "_manifest.json").read_text())
    assert len(manifest["shards"]) == 8 and manifest["metrics"]["accuracy"] == job["metrics"]["accuracy"]


def test_an_evaluate_job_scores_the_digits_model_per_device_and_writes_no_outputs(cluster: Cluster,
                                                                                 tmp_path: Path) -> None:
    spec = yaml.safe_load((ROOT / "examples/digits/evaluate.yaml").read_text())
    spec["output"] = str(tmp_path / "out")
    result = cluster.farm("submit", str(write_spec(tmp_path, **spec)), "--wait", "--json", "--workdir", str(ROOT))
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "succeeded" and job["kind"] == "evaluate" and job["items"] == 540
    metrics = job["metrics"]

    # The same figures as the model scored here over the whole test set.
    import torch

    from examples.digits import data, model

    reference = model.build()
    reference.load_state_dict(torch.load(ROOT / "examples/digits/weights.pt", weights_only=True))
    inputs, labels = data.test_set()
    with torch.inference_mode():
        logits = reference.eval()(torch.from_numpy(inputs))
        loss = float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels)))
        accuracy = float((logits.argmax(dim=1).numpy() == labels).mean())
    assert metrics["accuracy"] == pytest.approx(accuracy) and accuracy >= 0.90
    assert metrics["loss"] == pytest.approx(loss, rel=1e-4)
    devices = {f"{s['node_name']}/{s['device']}" for s in job["shards"]}
    assert devices <= {"agent-a/cpu", "agent-b/cpu"}
    for device in devices:  # every device that ran a shard has its own figures
        assert 0.8 <= metrics[f"accuracy@{device}"] <= 1.0 and 0 < metrics[f"loss@{device}"] < 1.0
    output = Path(job["output"])
    assert sorted(p.name for p in output.iterdir()) == ["_manifest.json"]  # scores only: no outputs
    manifest = json.loads((output / "_manifest.json").read_text())
    assert {d["device"] for d in manifest["devices"]} == devices and sum(d["items"] for d in manifest["devices"]) == 540


def test_submit_returns_at_once_and_the_job_can_be_followed(cluster: Cluster, toy: Path) -> None:
    spec = write_spec(toy, name="toy", model="toyjob:chatty", dataset="numbers.npz", shards=4, batch_size=3)
    submitted = cluster.farm("submit", str(spec), "--workdir", str(toy))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.startswith("j-")
    with Client(cluster.head) as client:
        final = list(client.watch(job_id))[-1]
    assert final.state == "succeeded"
    np.testing.assert_array_equal(read_predictions(Path(final.output)), np.arange(40).reshape(20, 2) * 2)
    assert "accuracy" not in final.metrics  # an .npz with only `x` has no labels

    listed = json.loads(cluster.farm("jobs", "--json").stdout)
    assert job_id in {j["id"] for j in listed}
    logs = cluster.farm("logs", job_id)
    assert "accepted: 20 items in 4 shards" in logs.stdout and "job succeeded" in logs.stdout
    # What each shard printed on the node (stdout and stderr as they interleaved), under its index.
    shard_1 = cluster.farm("logs", job_id, "--shard", "1", "--json")
    printed = "\n".join(line["message"] for line in json.loads(shard_1.stdout) if line["level"] == "output")
    assert "batch of 3 starting at 10" in printed and "a warning on stderr" in printed
    explained = cluster.farm("job", job_id, "--explain")
    assert explained.returncode == 0 and "shard 0 →" in explained.stdout


def test_a_shard_s_output_shows_while_it_runs(cluster: Cluster, toy: Path) -> None:
    """A print at model construction reaches the job's log while the shard works, not when it ends (it did 98 s
    later on a long shard)."""
    spec = write_spec(toy, name="talk", model="toyjob:talker", dataset="toyjob:numbers", shards=1, batch_size=2)
    job_id = cluster.farm("submit", str(spec), "--workdir", str(toy), "--no-check").stdout.strip()
    seen_running, seen_at = False, 0.0
    with Client(cluster.head) as client:
        for line in client.follow_logs(job_id):
            if line.level == "output" and "talker built" in line.message:
                seen_running, seen_at = client.job(job_id).state == "running", time.monotonic()
                break
        final = list(client.watch(job_id))[-1]
        ended_at = time.monotonic()
    assert final.state == "succeeded", final.error
    assert seen_running and ended_at - seen_at > 3  # 16 batches at 0.5 s each were still to come
    printed = [line["message"] for line in json.loads(cluster.farm("logs", job_id, "--json").stdout)
               if line["level"] == "output"]
    assert sum("talker built" in text for text in printed) == 1  # live, and not again with the result


def test_a_model_that_raises_fails_the_job_with_its_error(cluster: Cluster, toy: Path) -> None:
    spec = write_spec(toy, name="broken", model="toyjob:broken", dataset="toyjob:numbers", shards=2)
    # --no-check: the preflight would run the model here and refuse it before it reaches a node.
    result = cluster.farm("submit", str(spec), "--wait", "--json", "--workdir", str(toy), "--no-check")
    assert result.returncode == 1
    job = json.loads(result.stdout)
    assert job["state"] == "failed"
    assert "ValueError: this model is broken on purpose" in job["error"]
    assert "\n" not in job["error"]
    # The job log has what the failed shard printed and its whole traceback, from the node.
    failed = int(job["error"].split(":")[0].removeprefix("shard "))
    logs = cluster.farm("logs", job["id"], "--shard", str(failed))
    assert logs.returncode == 0, logs.stderr
    assert f"[shard {failed}] about to break on a batch of" in logs.stdout
    assert "Traceback (most recent call last):" in logs.stdout and "in forward" in logs.stdout
    assert "ValueError: this model is broken on purpose" in logs.stdout
    assert f"[shard {1 - failed}]" not in logs.stdout
    # Issue 31: the error names the shard's rows and its batch's first row; the traceback starts at the job's code,
    # Farm's own frames only with --verbose.
    first = 0 if failed == 0 else 16
    assert f"shard {failed}: rows {first}-{first + 15}, the batch from row {first}: ValueError" in job["error"]
    assert "farm_agent" not in logs.stdout
    verbose = cluster.farm("logs", job["id"], "--shard", str(failed), "--verbose")
    assert "farm_agent/work/kinds/inference.py" in verbose.stdout


def test_cancel_stops_a_running_job(cluster: Cluster, toy: Path) -> None:
    # 8 shards of 4 half-second batches on two one-slot nodes: about 8 s if left alone.
    spec = write_spec(toy, name="slow", model="toyjob:slow", dataset="toyjob:numbers", shards=8, batch_size=1)
    job_id = cluster.farm("submit", str(spec), "--workdir", str(toy)).stdout.strip()
    with Client(cluster.head) as client:
        for record in client.watch(job_id):
            if record.state == "running":
                break
        cancelled = cluster.farm("cancel", job_id, "--json")
        assert cancelled.returncode == 0, cancelled.stderr
        assert json.loads(cancelled.stdout)["state"] == "cancelled"
        job = client.job(job_id)
    assert job.state == "cancelled"
    assert all(s.state in ("cancelled", "succeeded") for s in job.shards)
    again = cluster.farm("cancel", job_id)
    assert again.returncode == 2 and "already cancelled" in again.stderr


def kill_hard(status_path: Path) -> None:
    """A machine that vanishes: its agent and its whole Ray node die at once, with no goodbye."""
    status = json.loads(status_path.read_text())
    agent = psutil.Process(status["pid"])
    doomed = [agent, *agent.children(recursive=True)]  # its persistent workers
    if status["ray_pid"]:  # a trusted node's Ray node (0 for a lent node, which has none: session 0 is the kernel's)
        doomed += [p for p in psutil.process_iter() if _session(p.pid) == status["ray_pid"]]
    for proc in doomed:
        with contextlib.suppress(psutil.NoSuchProcess):  # one killed a moment ago takes its children with it
            proc.kill()
    psutil.wait_procs(doomed, timeout=10)


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_a_node_lost_mid_job_hands_its_shards_to_the_others(cluster: Cluster, toy: Path) -> None:
    third = cluster.farm("agent", "start", "--head", cluster.head.address, "--token", cluster.head.join_token,
                         "--name", "agent-c", "--cpus", "1", "--state-dir", str(cluster.state_dir), "--detach",
                         "--max-foreign-cpu", "100")
    assert third.returncode == 0, third.stderr
    spec = write_spec(toy, name="lossy", model="toyjob:slow", dataset="toyjob:numbers", shards=6, batch_size=1)
    job_id = cluster.farm("submit", str(spec), "--workdir", str(toy)).stdout.strip()
    with Client(cluster.head) as client:
        for record in client.watch(job_id):
            if any(s.state == "running" and s.node_name == "agent-c" for s in record.shards):
                break
        kill_hard(cluster.state_dir / "agents" / "agent-c" / "agent.json")
        final = list(client.watch(job_id))[-1]
        logs = [line.message for line in client.logs(job_id)]
    assert final.state == "succeeded", final.error
    assert any("goes back to the queue" in m for m in logs)
    assert {s.node_name for s in final.shards} <= {"agent-a", "agent-b"}
    np.testing.assert_array_equal(read_predictions(Path(final.output)), np.arange(64).reshape(32, 2) * 2)
