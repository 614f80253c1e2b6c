"""What the dashboard's page gets (farm.dashboard.views), on a real store: which jobs run on each node, perf/W rows
that say what sets one model's rows apart, a running job's rate and time left, and an estimated idle draw of 0 W
shown as not metered rather than as a meter reading 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.core.energy import Energy, EnergyScope, EnergySource
from farm.core.models import BackendName, BackendOffer, Hardware, JobState, Node, NodeState
from farm.dashboard.views import fleet_view, idle_draw, job_summary, perf_by_model
from farm.head.store import Store

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=8, memory_bytes=2**34)
CUDA = BackendOffer(name=BackendName.CUDA, device="cuda:0")
CPU = BackendOffer(name=BackendName.CPU, device="cpu")


def counter(joules: float) -> Energy:
    return Energy(joules=joules, seconds=1.0, source=EnergySource.COUNTER, scope=EnergyScope.DEVICE)


def a_store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "state.db")
    store.upsert_node("n-1", "gpu-box", HW, [CUDA, CPU], "10.0.0.1", "h")
    store.upsert_node("n-2", "laptop", HW, [CPU], "10.0.0.2", "h")
    for node_id in ("n-1", "n-2"):
        store.set_node_state(node_id, NodeState.READY)
    return store


def node(store: Store, node_id: str) -> Node:
    return next(n for n in store.nodes() if n.id == node_id)


def test_each_node_lists_the_jobs_running_on_it(tmp_path: Path) -> None:
    store = a_store(tmp_path)
    store.add_job("j-1", "digits <b>", "inference", "name: digits\n", "/c.zip", "/out", 100, [(0, 50), (50, 100)])
    store.set_job_state("j-1", JobState.RUNNING)
    store.shard_started("j-1", 0, node(store, "n-1"), "cuda", "cuda:0")
    store.shard_started("j-1", 1, node(store, "n-1"), "cpu", "cpu")
    fleet = fleet_view(store.nodes(), store.jobs(states=(JobState.RUNNING,)), store.work_by_node())
    jobs = {n["id"]: n["jobs"] for n in fleet["nodes"]}
    assert jobs == {"n-1": [{"id": "j-1", "name": "digits <b>"}], "n-2": []}  # once, though two shards run there


def test_rows_of_one_model_say_what_sets_them_apart(tmp_path: Path) -> None:
    """The same model at two batch sizes on the GPU, and on the CPU: three rows, each labelled by what differs."""
    store = a_store(tmp_path)
    gpu = node(store, "n-1")
    for job_id, batch, backend, device, joules in (("j-a", 64, "cuda", "cuda:0", 10.0),
                                                   ("j-b", 256, "cuda", "cuda:0", 5.0),
                                                   ("j-c", 64, "cpu", "cpu", 40.0)):
        store.add_job(job_id, job_id, "inference", f"name: {job_id}\nmodel: m:build\nbatch_size: {batch}\n",
                      "/c.zip", "/out", 100, [(0, 100)], model_key=f"key-{batch}")
        store.shard_started(job_id, 0, gpu, backend, device)
        store.shard_succeeded(job_id, 0, 100, 1.0, None, counter(joules))
    rows = perf_by_model(store.jobs(limit=10))
    assert [(r["backend"], r["device"], r["setup"], r["items_per_j"]) for r in rows] == [
        ("cuda", "cuda:0", "device cuda:0 · batch 256", pytest.approx(20.0)),
        ("cuda", "cuda:0", "device cuda:0 · batch 64", pytest.approx(10.0)),
        ("cpu", "cpu", "device cpu · batch 64", pytest.approx(2.5)),
    ]


def test_a_model_with_one_row_needs_no_label_and_identical_setups_name_their_calibration_key(tmp_path: Path) -> None:
    store = a_store(tmp_path)
    gpu = node(store, "n-1")
    for job_id, model, key in (("j-a", "m:build", "key-old-code"), ("j-b", "m:build", "key-new-code"),
                               ("j-c", "other:build", "key-other")):
        store.add_job(job_id, job_id, "inference", f"name: {job_id}\nmodel: {model}\n", "/c.zip", "/out", 10,
                      [(0, 10)], model_key=key)
        store.shard_started(job_id, 0, gpu, "cuda", "cuda:0")
        store.shard_succeeded(job_id, 0, 10, 1.0, None, counter(1.0))
    setups = sorted((r["model"], r["setup"]) for r in perf_by_model(store.jobs(limit=10)))
    assert setups == [("m:build", "calibration key key-new-code"), ("m:build", "calibration key key-old-code"),
                      ("other:build", "")]


def test_a_running_job_has_a_rate_and_a_time_left(tmp_path: Path) -> None:
    store = a_store(tmp_path)
    store.add_job("j-1", "digits", "inference", "name: digits\n", "/c.zip", "/out", 100, [(0, 40), (40, 100)])
    store.set_job_state("j-1", JobState.RUNNING)
    store.shard_started("j-1", 0, node(store, "n-1"), "cuda", "cuda:0")
    store.shard_succeeded("j-1", 0, 40, 1.0, None, counter(1.0))
    job = store.job("j-1")
    summary = job_summary(job, now=job.started_at + 20.0)
    assert summary["rate_items_per_s"] == pytest.approx(2.0) and summary["eta_s"] == pytest.approx(30.0)
    # Retried after lying ended for 100 s: the rate is over the time it ran
    paused = job.model_copy(update={"metrics": {**job.metrics, "paused_s": 100.0}})
    assert job_summary(paused, now=job.started_at + 120.0)["rate_items_per_s"] == pytest.approx(2.0)
    store.add_job("j-2", "fresh", "inference", "name: fresh\n", "/c.zip", "/out", 100, [(0, 100)])
    assert job_summary(store.job("j-2"))["eta_s"] is None  # queued: no rate yet


def test_an_estimated_idle_draw_of_zero_is_not_metered_and_says_why() -> None:
    unmetered = idle_draw(CPU.model_copy(update={"idle_w": 0.0, "idle_source": EnergySource.MODEL_ESTIMATE.value}))
    assert unmetered["idle_w"] is None and unmetered["idle_unmetered"].startswith("not metered: ")
    measured = idle_draw(CUDA.model_copy(update={"idle_w": 61.5, "idle_source": EnergySource.COUNTER.value}))
    assert measured == {"idle_w": 61.5, "idle_source": "counter", "idle_estimate": False, "idle_unmetered": ""}
    assert idle_draw(CPU)["idle_w"] is None and not idle_draw(CPU)["idle_unmetered"]  # none measured yet
