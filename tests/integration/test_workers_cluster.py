"""Persistent workers on the shared cluster's two agents (issue 27): a worker per (job, node, device) keeps the model
loaded across its shards; a worker killed mid-queue has its shards run again, each row once; a cancelled job leaves no
worker behind; a job without variables of its own takes the warm worker its device kept ready, and runs its own code
there."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.dataset as ds

from farm.local import wait_for
from tests.conftest import Cluster
from tests.integration.test_cluster import write_spec


def spec(work: Path, name: str, shards: int, delay_s: float) -> Path:
    return write_spec(work, name=name, kind="inference", model="workerjob:counted", dataset="workerjob:numbers",
                      shards=shards, batch_size=10, backends=["cpu"], output=str(work / "out"),
                      env={"COUNT_FILE": str(work / "builds.txt"), "DELAY_S": str(delay_s)})


def rows_once(work: Path) -> None:
    ids = ds.dataset(sorted((work / "out").glob("shard-*.parquet"))).to_table(columns=["row_id"])["row_id"]
    assert sorted(ids.to_pylist()) == list(range(200))


def workers_of(job_id: str) -> list[psutil.Process]:
    """The live worker processes of a job (their command line names the worker's module; its folder, the job)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info["cmdline"] or []
        if "farm_agent.work.host" in cmdline and job_id[-12:] in str(proc.info["cwd"] or ""):
            found.append(proc)
    return found


def test_a_20_shard_job_on_two_agents_builds_its_model_once_per_node(cluster: Cluster, work: Path) -> None:
    result = cluster.farm("submit", str(spec(work, "once", 20, 0.02)), "--wait", "--json", "--no-check",
                          "--workdir", str(work), timeout=300)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["state"] == "succeeded"
    nodes = {s["node_id"] for s in job["shards"]}
    builds = Counter((work / "builds.txt").read_text().split())
    assert len(builds) == len(nodes) and set(builds.values()) == {1}  # one worker a node, one build each
    rows_once(work)


def test_a_worker_killed_mid_queue_reruns_its_shards_once_and_each_row_lands_once(cluster: Cluster,
                                                                                   work: Path) -> None:
    job_id = cluster.farm("submit", str(spec(work, "killed", 10, 0.3)), "--no-check", "--workdir",
                          str(work)).stdout.strip()
    assert wait_for(lambda: bool(workers_of(job_id)), 60, 0.2), "no worker started"
    victim = workers_of(job_id)[0]
    wait_for(lambda: False, 1.5, 0.5)  # into its first shard
    victim.kill()
    waited = cluster.farm("job", job_id, "--wait", "--json", timeout=300)
    job = json.loads(waited.stdout)
    assert job["state"] == "succeeded", job.get("error")
    assert max(s["attempts"] for s in job["shards"]) == 2  # the killed worker's shards ran once more, no more
    rows_once(work)
    logs = cluster.farm("logs", job_id).stdout
    assert "its worker was killed by SIGKILL" in logs  # its signal by name (farm_agent.daemon.workers.exit_reason)


def test_a_cancelled_job_leaves_no_worker(cluster: Cluster, work: Path) -> None:
    job_id = cluster.farm("submit", str(spec(work, "cancelled", 10, 0.5)), "--no-check", "--workdir",
                          str(work)).stdout.strip()
    assert wait_for(lambda: bool(workers_of(job_id)), 60, 0.2), "no worker started"
    assert cluster.farm("cancel", job_id).returncode == 0
    assert wait_for(lambda: not workers_of(job_id), 30, 0.2), [p.pid for p in workers_of(job_id)]


def warm_workers() -> set[int]:
    """The pids of the warm workers no job has taken yet (farm_agent.daemon.workers names their folders w<N>-warm)."""
    found = set()
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        if "farm_agent.work.host" in (proc.info["cmdline"] or []) and \
                str(proc.info["cwd"] or "").endswith("-warm/code"):
            found.add(proc.pid)
    return found


def test_a_job_without_variables_takes_a_warm_worker_and_runs_its_own_code_there(cluster: Cluster,
                                                                                   work: Path) -> None:
    def submit(name: str) -> dict[str, object]:
        path = write_spec(work, name=name, kind="inference", model="workerjob:doubled", dataset="workerjob:numbers",
                          shards=2, batch_size=10, backends=["cpu"], output=str(work / name))
        done = cluster.farm("submit", str(path), "--wait", "--json", "--no-check", "--workdir", str(work),
                            timeout=300)
        assert done.returncode == 0, done.stderr
        job: dict[str, object] = json.loads(done.stdout)
        assert job["state"] == "succeeded", job.get("error")
        return job

    submit("before")  # a device that ran a shard keeps a warm worker for its next job
    assert wait_for(lambda: bool(warm_workers()), 120, 0.2), "no warm worker after a job"
    ready = warm_workers()
    job = submit("after")
    ids = ds.dataset(str(work / "after")).to_table(columns=["row_id"])["row_id"].to_pylist()
    assert sorted(ids) == list(range(200))
    taken = [int(pid) for pid in re.findall(r"a warm worker taken on node \S+ \S+ \(pid (\d+)",
                                            cluster.farm("logs", str(job["id"])).stdout)]
    assert taken and set(taken) <= ready, (taken, ready)
