from __future__ import annotations

import itertools

import pytest

from farm.core.spec import Policy
from farm.scheduler.plan import DeviceRate, plan

GPU = DeviceRate(node_id="box", device="cuda:0", items_per_s=1000, items_per_j=10)  # 100 W
CPU = DeviceRate(node_id="box", device="cpu", items_per_s=100, items_per_j=2)  # 50 W
MAC = DeviceRate(node_id="mac", device="ane", items_per_s=300, items_per_j=30)  # 10 W


def test_efficiency_puts_everything_on_the_most_efficient_device() -> None:
    result = plan([100] * 8, [GPU, CPU, MAC], Policy.EFFICIENCY)
    assert result.quotas == {("mac", "ane"): 8}
    assert result.energy_j == pytest.approx(800 / 30)
    assert result.makespan_s == pytest.approx(800 / 300)


def test_throughput_spreads_by_speed_and_beats_any_single_device() -> None:
    result = plan([100] * 13, [GPU, CPU, MAC], Policy.THROUGHPUT)
    assert sum(result.quotas.values()) == 13
    assert result.quotas[("box", "cuda:0")] > result.quotas[("mac", "ane")] >= result.quotas.get(("box", "cpu"), 0)
    assert result.makespan_s < 1300 / 1000


def test_throughput_is_the_exact_optimum_on_a_small_case() -> None:
    shards = [100] * 6
    devices = [GPU, CPU, MAC]
    best = min(
        max(sum(shards[i] for i in range(6) if choice[i] == d) / devices[d].items_per_s for d in range(3))
        for choice in itertools.product(range(3), repeat=6)
    )
    assert plan(shards, devices, Policy.THROUGHPUT).makespan_s == pytest.approx(best)


def test_deadline_uses_the_cheapest_devices_that_still_finish_in_time() -> None:
    loose = plan([100] * 8, [GPU, CPU, MAC], Policy.DEADLINE, deadline_s=10)
    assert loose.quotas == {("mac", "ane"): 8} and loose.feasible
    tight = plan([100] * 8, [GPU, CPU, MAC], Policy.DEADLINE, deadline_s=1.0)
    assert tight.feasible and tight.makespan_s <= 1.0
    assert tight.quotas[("mac", "ane")] == 3  # all the Mac can finish in 1 s, then the next most efficient
    assert tight.energy_j is not None and tight.energy_j < plan([100] * 8, [GPU, CPU, MAC], Policy.THROUGHPUT).energy_j


def test_an_impossible_deadline_says_so_and_by_how_much() -> None:
    result = plan([100] * 8, [CPU], Policy.DEADLINE, deadline_s=1.0)
    assert not result.feasible
    assert "no plan meets deadline_s=1" in result.why and "takes 8.0 s" in result.why


def test_running_work_delays_a_device() -> None:
    busy_gpu = GPU.model_copy(update={"busy_s": 100.0})
    assert ("box", "cuda:0") not in plan([100] * 4, [busy_gpu, MAC], Policy.THROUGHPUT).quotas


def test_several_slots_work_in_parallel() -> None:
    two_slots = CPU.model_copy(update={"slots": 2})
    assert plan([100] * 4, [two_slots], Policy.THROUGHPUT).makespan_s == pytest.approx(2.0)


def test_unknown_energy_leaves_the_plan_energy_unknown() -> None:
    unknown = CPU.model_copy(update={"items_per_j": None})
    assert plan([100] * 2, [unknown], Policy.EFFICIENCY).energy_j is None
    assert plan([], [unknown], Policy.EFFICIENCY).quotas == {}
    assert not plan([100], [], Policy.EFFICIENCY).feasible


def test_efficiency_spreads_over_equally_efficient_devices() -> None:
    twin = MAC.model_copy(update={"node_id": "mac-2", "items_per_j": 29.0})  # within 5% of the best
    result = plan([100] * 8, [GPU, CPU, MAC, twin], Policy.EFFICIENCY)
    assert result.quotas == {("mac", "ane"): 4, ("mac-2", "ane"): 4}


def test_without_any_energy_figure_efficiency_falls_back_to_speed() -> None:
    blind = [d.model_copy(update={"items_per_j": None}) for d in (GPU, CPU)]
    assert plan([100] * 11, blind, Policy.EFFICIENCY).quotas == {("box", "cuda:0"): 10, ("box", "cpu"): 1}


def test_deadline_is_the_exact_least_energy_plan_on_a_small_case() -> None:
    shards, devices, deadline = [100] * 6, [GPU, CPU, MAC], 1.0
    best = min(
        sum(100 / devices[d].items_per_j for d in choice)  # type: ignore[operator]
        for choice in itertools.product(range(3), repeat=6)
        if all(choice.count(d) * 100 / devices[d].items_per_s <= deadline for d in range(3))
    )
    assert plan(shards, devices, Policy.DEADLINE, deadline_s=deadline).energy_j == pytest.approx(best)


def test_a_smaller_shard_still_fills_a_device_a_larger_one_did_not_fit() -> None:
    # Shards [11, 11, 10]: A finishes 11 + 10 in 2.1 s; the second 11 goes to B.
    a = DeviceRate(node_id="a", device="cpu", items_per_s=10, items_per_j=10)
    b = DeviceRate(node_id="b", device="cpu", items_per_s=6, items_per_j=1)
    result = plan([11, 11, 10], [a, b], Policy.DEADLINE, deadline_s=2.15)
    assert result.feasible and result.quotas == {("a", "cpu"): 2, ("b", "cpu"): 1}
    assert result.energy_j == pytest.approx(21 / 10 + 11 / 1)


def test_efficiency_tells_like_figures_apart_finely_and_unlike_ones_only_beyond_their_meters() -> None:
    best = DeviceRate(node_id="h200", device="cuda:0", items_per_s=1000, items_per_j=10, energy_source="counter")
    twin = DeviceRate(node_id="h100", device="cuda:0", items_per_s=1000, items_per_j=8.5, energy_source="counter")
    estimated = DeviceRate(node_id="laptop", device="cpu", items_per_s=1000, items_per_j=7,
                           energy_source="model-estimate")
    # Two counters 15 % apart: the better one takes everything.
    assert set(plan([100] * 8, [best, twin], Policy.EFFICIENCY).quotas) == {("h200", "cuda:0")}
    # A model estimate 30 % below a counter cannot be told apart from it (±50 % and ±5 %): both share the work.
    assert set(plan([100] * 8, [best, estimated], Policy.EFFICIENCY).quotas) == {("h200", "cuda:0"),
                                                                                 ("laptop", "cpu")}
    far = estimated.model_copy(update={"items_per_j": 2.0})  # 80 % below: beyond both meters' error
    assert set(plan([100] * 8, [best, far], Policy.EFFICIENCY).quotas) == {("h200", "cuda:0")}
