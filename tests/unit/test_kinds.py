"""The job-kind seam: a handler per kind behind one interface, one manifest shape, one failure path, and no branch on
the kind anywhere else on the job path. A real store (SQLite), real output files, the dispatcher without Ray."""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from ray import exceptions as ray_errors

import farm
from farm.core.energy import Energy, EnergyScope, EnergySource
from farm.core.errors import SpecError
from farm.core.kernels import KernelResult
from farm.core.models import BackendName, BackendOffer, JobState, ShardState
from farm.core.spec import JobKind, parse_spec
from farm.core.tasks import ShardFigures
from farm.head import autoshard, kinds
from farm.head.attempts import Running
from farm.head.dispatch import Dispatcher, Round
from farm.head.kinds.base import Submission
from farm.data.batches import output_column
from farm_agent.work.kinds.kernel_eval import rows_table
from tests.stores import HW, one_node_store
from tests.uploads import arrive, parts, stream
from farm.head.outcomes import NodeLost, ShardRecord, sort_failure
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.tls import HeadTLS

SETTINGS = HeadSettings(state_dir=Path("/nowhere"))  # planning these kinds reads nothing from the state folder

INFER = "name: toy\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 3\n"
TRAIN = ("name: t\nkind: training\nmodel: m:build\ndataset: d:train\nbatch_size: 10\n"
         "training: {steps: 25, checkpoint_every: 10}\n")
EVALUATE = "name: e\nkind: evaluate\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nshards: 2\n"
KERNELS = "name: k\nkind: kernel-eval\nkernel_eval: {problems: p, candidates: c, candidates_per_shard: 2}\n"
ROOT = Path(farm.__file__).parent


def code(*names: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in names:
            archive.writestr(name, "x = 1\n")
    return buffer.getvalue()


def submission(items: int, *names: str) -> Submission:
    data = code(*names)
    return Submission(data, frozenset(names), items)


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return one_node_store(tmp_path)


def dispatcher(store: Store, tmp_path: Path) -> Dispatcher:
    return Dispatcher(store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None)


def test_every_kind_has_a_handler_and_a_spec() -> None:
    assert set(kinds.HANDLERS) == set(JobKind)
    for text in (INFER, TRAIN, KERNELS, EVALUATE):
        spec = parse_spec(text)
        assert kinds.HANDLERS[spec.kind].kind is spec.kind


# The job path's modules, where the kind once was branched on; only farm/head/kinds may know a kind by name.
JOB_PATH = ["head/dispatch.py", "head/jobs.py", "head/outcomes.py", "head/output.py", "head/servicers.py",
            "cli/jobs.py", "client/preflight.py"]
KIND_BRANCH = re.compile(r"JobKind\.[A-Z_]+|kind\s*(==|!=|is|is not)\s|training is not None|kernel_eval is None")


@pytest.mark.parametrize("module", JOB_PATH)
def test_no_branch_on_the_job_kind_outside_the_handlers(module: str) -> None:
    found = [line.strip() for line in (ROOT / module).read_text().splitlines() if KIND_BRANCH.search(line)]
    assert found == [], f"{module} branches on the job kind: {found}"


def test_no_module_of_the_head_is_over_400_lines() -> None:
    """Issue 17's bound: a head module that outgrows it holds two things, and one of them wants a module."""
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "head").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_plans_inference_in_shards_of_rows_and_checks_its_files() -> None:
    plan = kinds.HANDLERS[JobKind.INFERENCE](SETTINGS).plan(parse_spec(INFER), submission(10, "toyjob.py"))
    assert (plan.items, plan.ranges) == (10, [(0, 4), (4, 7), (7, 10)]) and len(plan.model_key) == 16
    with pytest.raises(SpecError, match="weights 'w.pt' is not in the job's code"):
        kinds.HANDLERS[JobKind.INFERENCE](SETTINGS).plan(parse_spec(INFER + "weights: w.pt\n"),
                                                         submission(10, "toyjob.py"))
    with pytest.raises(SpecError, match="empty"):
        kinds.HANDLERS[JobKind.INFERENCE](SETTINGS).plan(parse_spec(INFER), submission(0, "toyjob.py"))


def test_plans_training_in_stretches_of_steps_between_checkpoints() -> None:
    plan = kinds.HANDLERS[JobKind.TRAINING](SETTINGS).plan(parse_spec(TRAIN), submission(100, "m.py"))
    assert (plan.items, plan.ranges) == (250, [(0, 10), (10, 20), (20, 25)])  # 25 steps of 10 samples
    with pytest.raises(SpecError, match="larger than the dataset"):
        kinds.HANDLERS[JobKind.TRAINING](SETTINGS).plan(parse_spec(TRAIN), submission(5, "m.py"))


def test_plans_kernel_eval_in_pairs_found_in_the_code() -> None:
    names = ("p/relu.py", "c/relu/a.py", "c/relu/b.py", "c/relu/c.py", "p/gelu.py", "c/gelu/x.py")
    plan = kinds.HANDLERS[JobKind.KERNEL_EVAL](SETTINGS).plan(parse_spec(KERNELS), submission(0, *names))
    assert (plan.items, plan.ranges) == (4, [(0, 1), (1, 3), (3, 4)])  # gelu's one, then relu's three by two


def test_every_kind_writes_one_manifest_shape(store: Store, tmp_path: Path) -> None:
    """Inference and kernel-eval finished through the one path: the same keys, each shard once with its file."""
    farm_ = dispatcher(store, tmp_path)
    node = store.nodes()[0]
    rows = {
        "inference": pa.table({"row_id": pa.array([0, 1], pa.int64()),
                               "output": output_column(np.zeros((2, 2), np.float32))}),
        "kernel-eval": rows_table([KernelResult(problem="p", candidate=c, compiled=True, correct=c == "a",
                                                max_abs_err=0.0, rel_norm_err=0.0, median_ms=1.0, eager_ms=1.0,
                                                compile_ms=1.0, speedup_vs_eager=1.0, speedup_vs_compile=1.0,
                                                reward=1.0, error="") for c in ("a", "b")]),
    }
    manifests = {}
    for kind, text in (("inference", INFER.replace("shards: 3", "shards: 1")), ("kernel-eval", KERNELS)):
        output = tmp_path / kind
        store.add_job(f"j-{kind}", "toy", kind, text, "/nowhere.zip", str(output), 2, [(0, 2)])
        job = store.job(f"j-{kind}")
        handler = farm_.handler(job)
        store.shard_started(job.id, 0, node, "cpu", "cpu")
        result = arrive(handler.staging(job, 0), [rows[kind]], items=2, seconds=0.1, correct=1)
        farm_.outcomes.succeeded(job.id, 0, handler.record(job, farm_.spec(job), store.job(job.id).shards[0],
                                                           result))
        assert farm_.outcomes.finish_if_done(job.id, handler, farm_.spec(job))
        assert store.job(job.id).state is JobState.SUCCEEDED
        manifests[kind] = json.loads((output / "_manifest.json").read_text())
    common = {"job_id", "name", "kind", "items", "metrics", "format", "shards"}
    assert all(common <= m.keys() for m in manifests.values())
    assert {m["kind"] for m in manifests.values()} == {"inference", "kernel-eval"}
    assert manifests["inference"]["shards"][0].keys() == manifests["kernel-eval"]["shards"][0].keys()
    assert [m["metrics"]["accuracy"] for m in manifests.values()] == [0.5, 0.5]
    assert (tmp_path / "inference" / manifests["inference"]["shards"][0]["file"]).is_file()
    assert (tmp_path / "kernel-eval" / "results.csv").is_file()


def test_a_spec_is_parsed_once_at_submit_and_kept(store: Store, tmp_path: Path) -> None:
    farm_ = dispatcher(store, tmp_path)
    store.add_job("j-1", "toy", "inference", INFER, "/nowhere.zip", str(tmp_path / "out"), 6, [(0, 2), (2, 4)])
    spec = parse_spec(INFER)
    farm_.admit("j-1", spec)
    assert farm_.spec(store.job("j-1")) is spec
    store.add_job("j-2", "toy", "inference", INFER, "/nowhere.zip", str(tmp_path / "out2"), 6, [(0, 6)])
    first = farm_.spec(store.job("j-2"))  # a head restarted: parsed from the store, once
    assert farm_.spec(store.job("j-2")) is first


def test_an_auto_sized_job_cuts_its_shards_while_it_runs(store: Store, tmp_path: Path) -> None:
    farm_ = dispatcher(store, tmp_path)
    text = INFER.replace("shards: 3", "shards: auto\nbatch_size: 2")
    spec = parse_spec(text)
    handler = kinds.HANDLERS[JobKind.INFERENCE](SETTINGS)
    assert handler.sizes_shards(spec) and handler.plan(spec, submission(100, "toyjob.py")).ranges == []
    store.add_job("j-1", "toy", "inference", text, "/nowhere.zip", str(tmp_path / "out"), 100, [])
    farm_.round = Round({n.id: n for n in store.nodes()})
    decided = autoshard.size(store.job("j-1"), spec, (BackendName.CPU,), list(farm_.round.nodes.values()),
                             farm_.round.busy, {}, store, None)
    assert [(c.node_id, c.start, c.stop) for c in decided.cuts] == [("n-1", 0, 8)]  # 4 batches: it measures the cpu
    assert autoshard.apply(store, store.job("j-1"), decided.cuts[0]) == 0
    job = store.job("j-1")
    assert [(s.index, s.start, s.stop, s.state) for s in job.shards] == [(0, 0, 8, ShardState.PENDING)]
    store.shard_started("j-1", 0, store.nodes()[0], "cpu", "cpu")
    store.shard_succeeded("j-1", 0, 8, 1.0, None, None)
    assert not farm_.outcomes.finish_if_done("j-1", handler, spec)  # rows 8-100 not cut yet: not done
    assert store.job("j-1").state is JobState.QUEUED
    # Measured now (8 rows a second: 4x is more than a 4th of its floor at that speed): the next cut grows 4x,
    # from where the last stopped.
    again = autoshard.size(store.job("j-1"), spec, (BackendName.CPU,), list(farm_.round.nodes.values()),
                           farm_.round.busy, {}, store, None)
    assert [(c.start, c.stop) for c in again.cuts] == [(8, 40)]


def test_a_shard_that_never_ran_is_cut_to_the_device_that_takes_it(store: Store, tmp_path: Path) -> None:
    text = INFER.replace("shards: 3", "shards: auto\nbatch_size: 2")
    spec = parse_spec(text)
    store.add_job("j-1", "toy", "inference", text, "/nowhere.zip", str(tmp_path / "out"), 100, [(0, 60)])
    round_ = Round({n.id: n for n in store.nodes()})
    decided = autoshard.size(store.job("j-1"), spec, (BackendName.CPU,), list(round_.nodes.values()), round_.busy,
                             {}, store, None)
    (cut,) = decided.cuts
    assert (cut.index, cut.start, cut.stop, cut.rest) == (0, 0, 8, (8, 60))
    assert autoshard.apply(store, store.job("j-1"), cut) == 0
    assert [(s.index, s.start, s.stop) for s in store.job("j-1").shards] == [(0, 0, 8), (1, 8, 60)]
    assert [(r.start, r.stop, r.index) for r in autoshard.pool(store.job("j-1"), running={0})] == [(8, 60, 1),
                                                                                                  (60, 100, None)]


def test_failures_are_sorted_into_the_nodes_and_the_jobs() -> None:
    assert sort_failure(ray_errors.WorkerCrashedError()).node
    assert sort_failure(NodeLost("node n-1 left the farm")).node
    code_error = ray_errors.RayTaskError("f", "tb", ValueError("bad input"))
    assert sort_failure(code_error) == sort_failure(code_error, collective=False)
    assert not sort_failure(code_error).node and sort_failure(code_error).message == "ValueError: bad input"
    peer = ray_errors.RayTaskError("f", "tb", RuntimeError("gloo/transport: Connection reset by peer"))
    assert not sort_failure(peer).node and sort_failure(peer, collective=True).node
    assert sort_failure(OSError("disk full")).message == "head: OSError: disk full"


def test_evaluate_reports_accuracy_and_loss_per_device_and_writes_no_outputs(store: Store, tmp_path: Path) -> None:
    store.upsert_node("n-2", "other", HW, [BackendOffer(name=BackendName.CPU, device="cpu")], "127.0.0.2", "h")
    farm_ = dispatcher(store, tmp_path)
    output = tmp_path / "out"
    plan = kinds.HANDLERS[JobKind.EVALUATE](SETTINGS).plan(parse_spec(EVALUATE), submission(30, "toyjob.py"))
    assert (plan.items, plan.ranges) == (30, [(0, 15), (15, 30)])
    store.add_job("j-1", "e", "evaluate", EVALUATE, "/nowhere.zip", str(output), 30, [(0, 10), (10, 20), (20, 30)])
    job = store.job("j-1")
    handler, spec = farm_.handler(job), farm_.spec(job)
    nodes = {n.name: n for n in store.nodes()}
    # box's two shards: 9/10 right at loss 0.2, 7/10 at 0.4; other's one: 10/10 at 0.1.
    for index, (name, correct, loss) in enumerate([("box", 9, 0.2), ("box", 7, 0.4), ("other", 10, 0.1)]):
        store.shard_started("j-1", index, nodes[name], "cpu", "cpu")
        result = arrive(None, items=10, seconds=0.1, correct=correct, metrics={"loss": loss})
        farm_.outcomes.succeeded("j-1", index, handler.record(job, spec, store.job("j-1").shards[index], result))
    assert farm_.outcomes.finish_if_done("j-1", handler, spec)
    metrics = store.job("j-1").metrics
    assert metrics["accuracy"] == pytest.approx(26 / 30) and metrics["loss"] == pytest.approx(0.7 / 3)
    assert metrics["accuracy@box/cpu"] == pytest.approx(0.8) and metrics["loss@box/cpu"] == pytest.approx(0.3)
    assert metrics["accuracy@other/cpu"] == pytest.approx(1.0) and metrics["loss@other/cpu"] == pytest.approx(0.1)
    manifest = json.loads((output / "_manifest.json").read_text())
    assert [(d["device"], d["items"]) for d in manifest["devices"]] == [("box/cpu", 20), ("other/cpu", 10)]
    assert sorted(p.name for p in output.iterdir()) == ["_manifest.json"]  # no outputs
    assert all("file" not in s for s in manifest["shards"])


def test_an_evaluate_spec_takes_a_known_loss_or_a_callable() -> None:
    assert parse_spec(EVALUATE + "loss: mse\n").loss == "mse"
    assert parse_spec(EVALUATE + "loss: pkg.mod:huber\n").loss == "pkg.mod:huber"
    with pytest.raises(SpecError, match="field 'loss': 'huber' is none of"):
        parse_spec(EVALUATE + "loss: huber\n")


AGENT_IMPORT = re.compile(r"^\s*(from|import)\s+farm_agent\b", re.M)


def test_the_head_reaches_the_agent_through_one_module_and_the_client_not_at_all() -> None:
    """farm_agent.entry is the head's door (imported by farm/head/remote.py alone); the client runs no agent code."""
    head = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "head").rglob("*.py") if AGENT_IMPORT.search(p.read_text()))
    assert head == ["head/remote.py"]
    assert "from farm_agent import entry\n" in (ROOT / "head/remote.py").read_text()
    client = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "client").rglob("*.py")
                    if AGENT_IMPORT.search(p.read_text()))
    assert client == []
    labels = [p for p in (*ROOT.rglob("*.py"), *(ROOT.parent / "agents").rglob("*.py"))
              if '"farm.io/node"' in p.read_text()]
    assert [p.name for p in labels] == ["ids.py"]  # NODE_LABEL defined once, in farm.core


def test_a_shards_energy_above_idle_comes_from_its_devices_idle_draw_on_the_same_meter(store: Store,
                                                                                       tmp_path: Path) -> None:
    gpu = BackendOffer(name=BackendName.CUDA, device="cuda:0", meter_step_s=0.1, idle_w=125.0, idle_source="counter")
    store.upsert_node("n-2", "gpu", HW, [gpu], "127.0.0.1", "h")
    farm_ = dispatcher(store, tmp_path)
    farm_.round = Round({n.id: n for n in store.nodes()})
    counter = Energy(joules=2040.0, seconds=3.0, source=EnergySource.COUNTER, scope=EnergyScope.DEVICE)
    record = ShardRecord(items=1, seconds=3.0, energy=counter)
    gpu_record = farm_._with_marginal(Running("n-2", "cuda:0"), record)
    assert gpu_record.marginal_j == pytest.approx(2040.0 - 125.0 * 3.0)
    assert farm_._with_marginal(Running("n-1", "cpu"), record).marginal_j is None  # no idle draw on that device


def first_cut_started(store: Store, tmp_path: Path) -> tuple[Dispatcher, int]:
    """An auto-sized toy job j-1 whose first cut runs on the first node's cpu: the dispatcher and the shard's index."""
    text = INFER.replace("shards: 3", "shards: auto\nbatch_size: 2")
    store.add_job("j-1", "toy", "inference", text, "/nowhere.zip", str(tmp_path / "out"), 100, [])
    farm_ = dispatcher(store, tmp_path)
    job, spec = store.job("j-1"), farm_.spec(store.job("j-1"))
    farm_.round = Round({n.id: n for n in store.nodes()})
    (cut,) = autoshard.size(job, spec, (BackendName.CPU,), list(farm_.round.nodes.values()), farm_.round.busy, {},
                            store, None).cuts
    index = autoshard.apply(store, job, cut)
    store.shard_started("j-1", index, store.nodes()[0], "cpu", "cpu")
    return farm_, index


def test_a_device_takes_its_next_shard_sized_by_the_last_while_that_ones_output_is_written(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 a 4 s shard's 180 MB output took ~2 s to write while its GPU idled: the device is free, and its
    next cut grown from the shard's measurement, as soon as the result is in; the shard counts as done only once
    its output is written (exactly once)."""
    import asyncio
    import threading

    from farm.data.results import Results

    farm_, index = first_cut_started(store, tmp_path)
    spec = farm_.spec(store.job("j-1"))
    release, writing = threading.Event(), threading.Event()
    commit_shard = Results.commit_shard

    def slow_commit(self: Results, *args: Any) -> Any:
        writing.set()
        assert release.wait(10)
        return commit_shard(self, *args)

    monkeypatch.setattr(Results, "commit_shard", slow_commit)
    rows = pa.table({"row_id": pa.array(range(8), pa.int64()), "output": output_column(np.zeros((8, 2), np.float32))})
    upload = parts([rows], ShardFigures(items=8, seconds=1.0))

    async def collect() -> None:
        farm_.attempts.start(("j-1", index), Running("n-1", "cpu", "ticket-1"))
        await farm_.receive("ticket-1", stream(upload))  # the upload's reply: the result is in
        await asyncio.to_thread(writing.wait, 10)
        assert farm_.wake.is_set() and ("j-1", index) not in farm_.attempts.running  # the device is free
        assert store.job("j-1").shards[index].state is ShardState.RUNNING  # not done until written
        grown = autoshard.size(store.job("j-1"), spec, (BackendName.CPU,), list(farm_.round.nodes.values()),
                               Counter(), {}, store, None, writing=farm_._writing(store.job("j-1"))).cuts
        assert [(c.start, c.stop) for c in grown] == [(8, 40)]  # grown 4x from the shard being written
        release.set()
        await asyncio.gather(*farm_.tasks)
        assert not farm_.writing and store.job("j-1").shards[index].state is ShardState.SUCCEEDED

    asyncio.run(collect())


def rounds_while_woken(farm_: Dispatcher) -> None:
    """The dispatcher's loop without its 1 s tick: a round only while the last one (or an event) woke it."""
    for _ in range(20):
        if not farm_.wake.is_set():
            return
        farm_.wake.clear()
        farm_.schedule()


@pytest.mark.parametrize("shards", ["auto", "8"])
def test_a_device_s_queue_slot_is_filled_in_the_round_after_a_launch_not_a_tick_later(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shards: str) -> None:
    """A round gives a device one shard. The round after a launch came only with the next event or the dispatcher's
    1 s tick: a device whose shards take less (a Parquet job's on an H100: 5-360 ms) had its next shard sent only
    once the last ended, so its worker never read one ahead. A round that launched wakes the next."""
    text = INFER.replace("shards: 3", f"shards: {shards}\nbatch_size: 2")
    (tmp_path / "code.zip").write_bytes(code("toyjob.py"))
    ranges = [] if shards == "auto" else [(i * 1250, (i + 1) * 1250) for i in range(8)]
    store.add_job("j-1", "toy", "inference", text, str(tmp_path / "code.zip"), str(tmp_path / "out"), 10_000, ranges)
    farm_ = dispatcher(store, tmp_path)
    HeadTLS.load_or_create(farm_.settings.tls_dir, ["127.0.0.1"])  # its CA goes with each shard's upload route
    monkeypatch.setattr(farm_.links, "send", lambda node_id, order: True)  # the node's end of its work stream
    farm_.wake.set()
    rounds_while_woken(farm_)
    # The first shard measures the device; one more goes behind it (sizing.size_behind_first), and no third.
    assert list(farm_.attempts.of_job("j-1")) == ([0, 1] if shards == "auto" else [0]), store.job("j-1").explanation
    farm_.attempts.release(("j-1", 0))
    farm_.outcomes.succeeded("j-1", 0, ShardRecord(items=8, seconds=0.01))  # the device is measured
    farm_.wake.set()
    rounds_while_woken(farm_)
    # Both slots of the node's cpu (tests.stores) and its queue (queue_depth 1) hold a shard, without a tick.
    assert len(farm_.attempts.of_job("j-1")) == 2 + farm_.settings.queue_depth, store.job("j-1").explanation


def test_the_last_round_s_reasons_outlive_the_rounds_with_nothing_left_to_cut(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`farm job --explain` after an auto-sized job was all cut showed no scheduling round at all: each round after
    the last cut, with nothing left, blanked what the rounds had said (a drained node's reason with it)."""
    text = INFER.replace("shards: 3", "shards: auto\nbatch_size: 2")
    (tmp_path / "code.zip").write_bytes(code("toyjob.py"))
    store.add_job("j-1", "toy", "inference", text, str(tmp_path / "code.zip"), str(tmp_path / "out"), 24, [])
    farm_ = dispatcher(store, tmp_path)
    HeadTLS.load_or_create(farm_.settings.tls_dir, ["127.0.0.1"])
    monkeypatch.setattr(farm_.links, "send", lambda node_id, order: True)  # the node's end of its work stream
    farm_.wake.set()
    rounds_while_woken(farm_)
    farm_.attempts.release(("j-1", 0))
    farm_.outcomes.succeeded("j-1", 0, ShardRecord(items=8, seconds=0.01))
    farm_.wake.set()
    rounds_while_woken(farm_)
    said = store.job("j-1").explanation
    assert "box/cpu" in said and sum(s.size for s in store.job("j-1").shards) == 24  # all cut
    farm_.schedule()  # a round with nothing left to cut
    assert store.job("j-1").explanation == said


def test_a_result_counts_for_sizing_from_the_moment_its_device_is_free(store: Store, tmp_path: Path) -> None:
    """The device was freed when its result was claimed, its figures counted only once its output had been checked
    (in a thread): a round in between, which the launches' wake-ups made frequent, cut the device's next shard
    from older figures (CI: three shards of 1,024 rows "growing 4x from 256", the third after a 1,024 had ended)."""
    import asyncio

    farm_, index = first_cut_started(store, tmp_path)
    spec = farm_.spec(store.job("j-1"))
    rows = pa.table({"row_id": pa.array(range(8), pa.int64()), "output": output_column(np.zeros((8, 2), np.float32))})

    async def claimed() -> list[tuple[int, int]]:
        farm_.attempts.start(("j-1", index), Running("n-1", "cpu", "ticket-1"))
        await farm_.receive("ticket-1", stream(parts([rows], ShardFigures(items=8, seconds=1.0))))
        # No await since: the settling task has not run, as a round the event loop ran first would find it.
        assert ("j-1", index) not in farm_.attempts.running  # the device is free
        grown = autoshard.size(store.job("j-1"), spec, (BackendName.CPU,), list(farm_.round.nodes.values()),
                               Counter(), {}, store, None, writing=farm_._writing(store.job("j-1"))).cuts
        await asyncio.gather(*farm_.tasks)
        return [(c.start, c.stop) for c in grown]

    assert asyncio.run(claimed()) == [(8, 40)]  # grown 4x from the claimed shard, not a first shard's 4 batches
