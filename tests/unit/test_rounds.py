from __future__ import annotations

from farm.core.models import BackendName, BackendOffer, Hardware, Node, NodeState
from farm.core.spec import Policy
from farm.scheduler import Rate, ShardRequest
from farm.scheduler.rounds import schedule_round

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="c", cpu_cores=8, memory_bytes=2**34)


def node(node_id: str, *offers: BackendOffer) -> Node:
    return Node(id=node_id, name=node_id, state=NodeState.READY, hardware=HW, backends=offers)


CPU = BackendOffer(name=BackendName.CPU, device="cpu", threads=8)
GPU = BackendOffer(name=BackendName.CUDA, device="cuda:0")


def shards(count: int, policy: Policy = Policy.EFFICIENCY) -> list[ShardRequest]:
    return [ShardRequest(job_id="j", index=i, items=100, backends=tuple(BackendName), policy=policy)
            for i in range(count)]


def test_unmeasured_devices_get_one_calibrating_shard_each() -> None:
    fleet = [node("a", CPU), node("b", CPU, GPU)]
    decided = schedule_round(shards(8), fleet, busy={}, running_items={}, rates={})
    assert sorted((a.node_id, a.device) for a in decided.assignments) == [("a", "cpu"), ("b", "cpu"), ("b", "cuda:0")]
    assert any("not measured yet" in line for line in decided.explanation)
    assert not decided.infeasible


def test_measured_devices_follow_the_plan() -> None:
    fleet = [node("a", CPU), node("b", CPU, GPU)]
    rates = {("a", "cpu"): Rate(items_per_s=100, items_per_j=2, energy_source="counter", samples=1),
             ("b", "cpu"): Rate(items_per_s=100, items_per_j=2, energy_source="counter", samples=1),
             ("b", "cuda:0"): Rate(items_per_s=1000, items_per_j=20, energy_source="counter", samples=1)}
    decided = schedule_round(shards(8), fleet, busy={}, running_items={}, rates=rates)
    assert [(a.node_id, a.device) for a in decided.assignments] == [("b", "cuda:0")]  # one slot, the rest wait
    assert decided.explanation[0].startswith("plan (efficiency) for 8 shards: b/cuda:0 8")
    assert "its planned share runs" in decided.waiting[0].why or "busy" in decided.waiting[0].why
    assert "a/cpu: not in the plan" in decided.waiting[0].why


def test_an_impossible_deadline_is_reported_once_everything_is_measured() -> None:
    fleet = [node("a", CPU)]
    rates = {("a", "cpu"): Rate(items_per_s=10, items_per_j=1, energy_source="model-estimate", samples=2)}
    decided = schedule_round(shards(4, Policy.DEADLINE), fleet, busy={}, running_items={}, rates=rates,
                             deadline_s=5.0)
    assert "no plan meets deadline_s=5" in decided.infeasible
    calibrating = schedule_round(shards(4, Policy.DEADLINE), [node("a", CPU), node("b", CPU)], busy={},
                                 running_items={}, rates=rates, deadline_s=5.0)
    assert not calibrating.infeasible  # b may still make it possible


def test_the_rest_waits_while_a_calibration_runs() -> None:
    fleet = [node("a", CPU), node("b", GPU)]
    rates = {("a", "cpu"): Rate(items_per_s=100, items_per_j=2, energy_source="counter", samples=1)}
    decided = schedule_round(shards(6), fleet, busy={("b", "cuda:0"): 1}, running_items={("b", "cuda:0"): 100},
                             rates=rates)
    assert decided.assignments == ()
    assert decided.explanation[0] == "waiting for calibration on b/cuda:0"


def test_a_device_measured_long_ago_gets_one_shard_that_measures_it_again() -> None:
    fleet = [node("a", CPU), node("b", GPU)]
    now = 1_000_000.0
    old = Rate(items_per_s=10, items_per_j=1, energy_source="counter", samples=3, measured_at=now - 7 * 3600)
    fresh = Rate(items_per_s=1000, items_per_j=50, energy_source="counter", samples=3, measured_at=now - 60)
    decided = schedule_round(shards(8), fleet, busy={}, running_items={},
                             rates={("a", "cpu"): old, ("b", "cuda:0"): fresh}, now=now)
    assert sorted(a.node_id for a in decided.assignments) == ["a", "b"]  # the plan alone would skip a
    assert any("a/cpu" in line and "measures it again" in line for line in decided.explanation)
    recent = schedule_round(shards(8), fleet, busy={}, running_items={},
                            rates={("a", "cpu"): old.model_copy(update={"measured_at": now - 60}),
                                   ("b", "cuda:0"): fresh}, now=now)
    assert [a.node_id for a in recent.assignments] == ["b"]
