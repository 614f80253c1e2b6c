"""The in-job A/B and the farm's shared winners through the head's own path: the real Dispatcher's inference
handler and outcomes over a real SQLite store, fed figures as a node sends them (protobuf, parsed and checked by
farm.proto.convert). Doubled edge: the node. The tuner cannot run a CUDA job here, so each shard's figures are
recorded ones (a node's ShardFigures message with its TuningOutcome), and a shard's marginal joules are set as the
dispatcher computes them from its node's idle draw. The node's side of a cache hit runs for real, on the CPU
(farm_agent.tuner.tune.tuned_forward with the winners the head handed out)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from farm.core.models import BackendName, BackendOffer, Hardware, Node, NodeState
from farm.core.spec import JobKind, parse_spec
from farm.core.tasks import ShardTask
from farm.core.tuning import TuningOutcome
from farm.head.arrivals import Arrival
from farm.head.dispatch import Dispatcher
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.proto import convert
from farm.proto.v1 import result_pb2
from farm.scheduler.types import Assignment

HW = Hardware(hostname="box", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=4, memory_bytes=2**33)
NODE = Node(id="n-1", name="gpu-box", state=NodeState.READY, hardware=HW,
            backends=(BackendOffer(name=BackendName.CUDA, device="cuda:0", idle_w=100.0, idle_source="counter"),))
SPEC = "name: tuned\nmodel: m:build\ndataset: d:rows\nshards: 8\ntune_budget_s: 60\nbackends: [cuda]\n"
SHAPES = ("float32[16, 8]",)


def _outcome(winner: str, tuning_s: float = 0.0, tuning_j: float | None = None,
             identity: tuple[str, str, str] = ("NVIDIA H200", "570.86", "2.9.0"),
             shapes: tuple[str, ...] = SHAPES) -> TuningOutcome:
    return TuningOutcome(winner=winner, params=(("precision", "ieee"),) if winner else (), tuning_s=tuning_s,
                         tuning_j=tuning_j, reason="tuned: 8,000 rows could save ~1.2 s" if tuning_s else "cached",
                         device_name=identity[0], driver=identity[1], torch_version=identity[2], input_shapes=shapes)


class Head:
    def __init__(self, tmp_path: Path) -> None:
        self.store = Store(tmp_path / "state.db")
        self.store.upsert_node("n-1", "gpu-box", HW, list(NODE.backends), "127.0.0.1", "h1")
        self.farm = asyncio.run(self._dispatcher(tmp_path))
        self.handler = self.farm.handlers[JobKind.INFERENCE]

    def _dispatcher(self, tmp_path: Path) -> asyncio.Future[Dispatcher]:
        async def make() -> Dispatcher:
            return Dispatcher(self.store, HeadSettings(state_dir=tmp_path / "state"), notify=lambda job_id: None)
        return make()  # type: ignore[return-value]

    def submit(self, job_id: str, model_key: str) -> None:
        self.store.add_job(job_id, "tuned", "inference", SPEC, "/nowhere.zip", "/out", 8000,
                           [(i * 1000, (i + 1) * 1000) for i in range(8)], model_key=model_key)

    def task(self, job_id: str, index: int) -> ShardTask:
        job = self.store.job(job_id)
        assignment = Assignment(job_id=job_id, index=index, node_id="n-1", backend=BackendName.CUDA,
                                device="cuda:0", threads=1, score=1.0)
        call = self.handler.task(job, parse_spec(SPEC), job.shards[index], assignment)  # type: ignore[attr-defined]
        return call.task  # type: ignore[no-any-return]

    def shard(self, job_id: str, index: int, seconds: float, marginal_j: float,
              outcome: TuningOutcome | None = None) -> ShardTask:
        """The shard's task as the head sends it, then its figures as its node sends them back."""
        task = self.task(job_id, index)
        self.farm.outcomes.started(self.store.job(job_id), index, NODE, "cuda", "cuda:0", "test")
        energy = result_pb2.Energy(joules=marginal_j + 100.0 * seconds, seconds=seconds, source="counter",
                                   scope="device")  # 100 W idle: `marginal_j` above it
        sent = result_pb2.ShardFigures(items=1000, seconds=seconds, energy=energy)
        if outcome is not None:
            sent.tuning.CopyFrom(convert.tuning_to_pb(outcome))
        record = self.handler.measured(Arrival(figures=convert.figures_from_pb(  # type: ignore[attr-defined]
            result_pb2.ShardFigures.FromString(sent.SerializeToString()))))
        self.farm.outcomes.succeeded(job_id, index, replace(record, marginal_j=marginal_j))
        return task

    def tuning_lines(self, job_id: str) -> list[str]:
        return [line["message"] for line in self.store.logs(job_id) if line["message"].startswith("tuning: ")]


def test_a_winner_that_loses_in_the_jobs_own_shards_is_reverted_and_shared_no_more(tmp_path: Path) -> None:
    head = Head(tmp_path)
    head.submit("j-1", "model-a")
    # 8000 items: each side needs 800 measured. Shard 0 runs eager and tunes nothing.
    assert head.shard("j-1", 0, 1.0, 300.0).tuning.eager
    # Shard 1 tries the winner: its node tuned (30 s, 9 kJ) and its winner is slower in the job's own shard.
    tried = head.shard("j-1", 1, 1.25, 280.0, _outcome("triton-fused", 30.0, 9000.0))
    assert not tried.tuning.eager
    assert head.task("j-1", 2).tuning.eager  # the rest runs eager
    lines = head.tuning_lines("j-1")
    assert "runs triton-fused (tuned: 8,000 rows could save ~1.2 s); the tuning took 30.0 s and 9,000 J" in lines[0]
    assert "triton-fused reverted: it was slower (0.80x rows/s and 1.07x items per joule above idle" in lines[1]
    assert "eager runs the rest of the job's shards here, which cost the tuning's 30.0 s and 9,000 J" in lines[1]
    assert head.store.winners_for("model-a", 1e-4, 1e-4, tried.tuning.objective) == []  # a loser is not shared


def test_a_winner_that_wins_is_kept_with_its_break_even_and_a_second_job_tunes_nothing(tmp_path: Path) -> None:
    from farm_agent.tuner.cache import WinnerCache, make_key
    from farm_agent.tuner.tune import tuned_forward

    torch.manual_seed(0)
    model, batch = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval(), torch.rand(16, 8)
    cpu = make_key(model, [batch], 1e-4, 1e-4, "cpu")  # what a node of this kind says it measured on
    identity = (cpu.device_name, cpu.driver, cpu.torch_version)
    head = Head(tmp_path)
    head.submit("j-1", "model-b")
    head.shard("j-1", 0, 1.0, 300.0)
    head.shard("j-1", 1, 0.5, 200.0, _outcome("triton-fused", 30.0, 9000.0, identity, cpu.input_shapes))
    assert not head.task("j-1", 2).tuning.eager  # kept: the winner runs the rest
    kept = head.tuning_lines("j-1")[-1]
    assert "triton-fused kept: 2.00x rows/s and 1.50x items per joule above idle against eager" in kept
    assert "it pays back its tuning (30.0 s, 9,000 J) in joules after 90,000 items" in kept

    # The next job of the same model (the same model key): its shards after the eager side carry the winner.
    head.submit("j-2", "model-b")
    assert head.shard("j-2", 0, 1.0, 300.0).tuning.eager
    task = head.task("j-2", 1)
    assert [w.winner for w in task.tuning.shared] == ["triton-fused"]
    assert task.tuning.budget_s == 60  # it could tune, and does not: a cache hit
    # On a node of the same kind, whose own cache is empty: the shared winner runs and nothing is tuned.
    forward, outcome = tuned_forward(model, batch, (1e-4, 1e-4), "cpu", WinnerCache(tmp_path / "node-2"),
                                     tune_first=True, budget_s=60.0, objective=task.tuning.objective,
                                     rows_left=10**9, shared=task.tuning.shared)
    assert outcome.winner == "triton-fused" and outcome.tuning_s == 0.0 and "farm shares" in outcome.reason
    assert not list((tmp_path / "node-2").glob("*.json"))  # no tuning run wrote a winner
    with torch.no_grad():
        torch.testing.assert_close(forward(batch), model(batch))
    # A node whose batch shape differs does not take it (the key's input shapes): it would tune.
    other = replace(task.tuning.shared[0], key=replace(task.tuning.shared[0].key, input_shapes=("float32[7, 8]",)))
    _, untuned = tuned_forward(model, batch, (1e-4, 1e-4), "cpu", WinnerCache(tmp_path / "node-3"),
                               objective=task.tuning.objective, shared=(other,))
    assert untuned.winner == ""


def test_a_shared_winner_that_names_no_known_family_is_refused_by_the_node(tmp_path: Path) -> None:
    from farm.core.tuning import SharedWinner, WinnerKey
    from farm_agent.tuner.cache import make_key
    from farm_agent.tuner.tune import shared_winner

    model, batch = nn.Linear(8, 4).eval(), torch.rand(16, 8)
    key = make_key(model, [batch], 1e-4, 1e-4, "cpu")
    wk = WinnerKey(key.device_name, key.driver, key.torch_version, "m", key.input_shapes, 1e-4, 1e-4,
                   key.objective)  # type: ignore[arg-type]
    assert shared_winner(key, [SharedWinner(wk, "triton-fused", (("precision", "ieee"),))]) is not None
    assert shared_winner(key, [SharedWinner(wk, "no-such-family")]) is None
    assert shared_winner(key, [SharedWinner(wk, "triton-fused", (("precision", "fp16"),))]) is None  # not its own


def test_a_tuning_shard_carries_its_device_s_idle_draw_as_its_agent_read_it_on_the_counter(tmp_path: Path) -> None:
    """A tuning run read the device's idle draw itself (2 s of a 34 s budget on an H100), and its candidates' joules
    were above that reading, not the one the job's energy is above. The head hands it the agent's counter reading;
    a reading on another meter (a model estimate) is not the counter's, and is not handed."""
    head = Head(tmp_path)
    head.submit("j-1", "model-a")
    assert head.task("j-1", 0).tuning.eager and head.task("j-1", 0).tuning.idle_w is None  # the A/B's eager side
    head.shard("j-1", 0, 1.0, 300.0)  # 1,000 eager items, of the 800 an 8,000-item job's A/B needs
    tuning = head.task("j-1", 1).tuning
    assert not tuning.eager and tuning.idle_w == 100.0
    estimated = BackendOffer(name=BackendName.CUDA, device="cuda:0", idle_w=0.0, idle_source="model_estimate")
    head.store.upsert_node("n-1", "gpu-box", HW, [estimated], "127.0.0.1", "h1")
    assert head.task("j-1", 1).tuning.idle_w is None
