from __future__ import annotations

from pathlib import Path

import pytest

from farm.core.models import BackendName, BackendOffer, Hardware, Node, NodeState
from farm.core.spec import Policy
from farm.scheduler import Rate, ShardRequest, place

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"


def hardware(name: str) -> Hardware:
    return Hardware.model_validate_json((NODES / f"{name}.json").read_text())


def node(node_id: str, fixture: str, *offers: BackendOffer, state: NodeState = NodeState.READY) -> Node:
    return Node(id=node_id, name=node_id, state=state, hardware=hardware(fixture), backends=offers)


def cpu(threads: int, slots: int = 1) -> BackendOffer:
    return BackendOffer(name=BackendName.CPU, device="cpu", threads=threads, slots=slots)


def gpu(index: int) -> BackendOffer:
    return BackendOffer(name=BackendName.CUDA, device=f"cuda:{index}", threads=1, slots=1)


def shards(count: int, backends: tuple[BackendName, ...] = tuple(BackendName), policy: Policy = Policy.EFFICIENCY,
           job: str = "j-1") -> list[ShardRequest]:
    return [ShardRequest(job_id=job, index=i, items=10, backends=backends, policy=policy) for i in range(count)]


def test_fills_every_free_slot_and_leaves_the_rest_waiting_with_a_reason() -> None:
    fleet = [node("laptop", "laptop-cpu", cpu(8)), node("h200", "h200x2-box", cpu(16), gpu(0), gpu(1))]
    placement = place(shards(6), fleet)
    assert len(placement.assignments) == 4  # one slot each: laptop cpu, h200 cpu, cuda:0, cuda:1
    assert {(a.node_id, a.device) for a in placement.assignments} == {
        ("laptop", "cpu"), ("h200", "cpu"), ("h200", "cuda:0"), ("h200", "cuda:1")}
    assert [w.index for w in placement.waiting] == [4, 5]
    assert "busy (1/1 slots)" in placement.waiting[0].why


def test_the_first_shards_go_to_the_fastest_devices_by_prior() -> None:
    fleet = [node("laptop", "laptop-cpu", cpu(8)), node("h200", "h200-box", cpu(16), gpu(0))]
    first, second, third = place(shards(3), fleet).assignments
    assert (first.node_id, first.device) == ("h200", "cuda:0")
    assert (second.node_id, second.device) == ("h200", "cpu")  # 16 threads beat 8
    assert (third.node_id, third.device) == ("laptop", "cpu")


def test_nodes_that_are_not_ready_are_filtered_with_their_state() -> None:
    fleet = [node("mac", "m2-pro-mac", cpu(12), state=NodeState.DRAINING),
             node("laptop", "laptop-cpu", cpu(8), state=NodeState.OFFLINE)]
    placement = place(shards(1), fleet)
    assert placement.assignments == ()
    assert "mac/cpu: node is draining" in placement.waiting[0].why
    assert "laptop/cpu: node is offline" in placement.waiting[0].why


def test_backends_the_job_does_not_allow_are_never_used() -> None:
    fleet = [node("h200", "h200-box", cpu(16), gpu(0))]
    placement = place(shards(2, backends=(BackendName.CPU,)), fleet)
    assert [a.device for a in placement.assignments] == ["cpu"]
    assert "cuda not allowed by the job" in placement.waiting[0].why


def test_an_unavailable_backend_says_why() -> None:
    broken = BackendOffer(name=BackendName.ANE, device="ane", available=False, slots=0, reason="coremltools missing")
    placement = place(shards(1, backends=(BackendName.ANE,)), [node("mac", "m2-pro-mac", broken)])
    assert "ane unavailable: coremltools missing" in placement.waiting[0].why


def test_running_shards_hold_their_slots() -> None:
    fleet = [node("a", "laptop-cpu", cpu(8, slots=2))]
    assert len(place(shards(3), fleet, busy={("a", "cpu"): 1}).assignments) == 1


def test_measurements_beat_priors_and_the_policy_picks_the_measure() -> None:
    fleet = [node("fast", "laptop-cpu", cpu(8)), node("frugal", "laptop-cpu", cpu(8))]
    rates = {("fast", "cpu"): Rate(items_per_s=1000, items_per_j=5), ("frugal", "cpu"): Rate(items_per_s=400, items_per_j=20)}
    assert place(shards(1, policy=Policy.THROUGHPUT), fleet, rates=rates).assignments[0].node_id == "fast"
    assert place(shards(1, policy=Policy.EFFICIENCY), fleet, rates=rates).assignments[0].node_id == "frugal"


def test_an_empty_fleet_is_named_as_the_reason() -> None:
    placement = place(shards(1), [])
    assert placement.waiting[0].why == "no nodes in the fleet"


@pytest.mark.parametrize("fixture", ["h200-box", "h200x2-box", "m2-pro-mac", "laptop-cpu"])
def test_node_fixtures_are_recorded_hardware(fixture: str) -> None:
    assert hardware(fixture).cpu_cores >= 1


def test_kinds_of_shards_share_the_slots_they_compete_for() -> None:
    fleet = [node("h200", "h200-box", cpu(16, slots=2), gpu(0))]
    anything = shards(2, job="j-any")
    cpu_only = shards(2, backends=(BackendName.CPU,), job="j-cpu")
    placement = place([*anything, *cpu_only], fleet)
    placed = {(a.job_id, a.index): a.device for a in placement.assignments}
    assert placed == {("j-any", 0): "cuda:0", ("j-any", 1): "cpu", ("j-cpu", 0): "cpu"}
    assert [(w.job_id, w.index) for w in placement.waiting] == [("j-cpu", 1)]
    assert "h200/cpu: busy (2/2 slots)" in placement.waiting[0].why


def test_a_node_whose_owner_is_busy_takes_nothing_and_says_why() -> None:
    fleet = [node("laptop", "laptop-cpu", cpu(8)).model_copy(update={"busy": "owner's CPU load 95% > 90%"})]
    placement = place(shards(1), fleet)
    assert placement.assignments == ()
    assert "laptop/cpu: owner busy: owner's CPU load 95% > 90%" in placement.waiting[0].why


def test_a_model_too_large_for_a_device_goes_where_it_fits() -> None:
    fleet = [node("laptop", "laptop-cpu", cpu(8)), node("h200", "h200-box", gpu(0))]
    laptop_memory = hardware("laptop-cpu").memory_bytes
    big = [s.model_copy(update={"model_bytes": laptop_memory + 1}) for s in shards(2)]
    placement = place(big, fleet)
    assert [(a.node_id, a.device) for a in placement.assignments] == [("h200", "cuda:0")]  # 141 GiB of HBM
    assert "laptop/cpu: needs" in placement.waiting[0].why
    # A measured peak on the backend replaces the model's size: this one ran on a CPU before, in less.
    measured = [s.model_copy(update={"peak_bytes": {BackendName.CPU: 2**30}}) for s in big]
    assert {a.node_id for a in place(measured, fleet).assignments} == {"laptop", "h200"}


def test_every_backend_and_policy_is_one_entry_of_a_table() -> None:
    """Adding a backend: its BackendName, its traits and its agent module (found by name); a policy: its Policy and
    its rule."""
    import importlib.util

    from farm.core.backends import BACKENDS
    from farm.core.spec import KERNEL_EVAL_BACKENDS
    from farm.scheduler.plan import POLICIES
    from farm_agent.backends import MODULES

    assert set(BACKENDS) == set(BackendName) == set(MODULES)
    assert all(importlib.util.find_spec(module) is not None for module in MODULES.values())
    assert KERNEL_EVAL_BACKENDS == ("cuda", "cpu")
    assert set(POLICIES) == set(Policy)
