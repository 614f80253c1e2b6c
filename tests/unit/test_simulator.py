from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType

import pytest

from farm.core.models import BackendName
from farm.core.spec import Policy
from farm.scheduler.simulator import (
    Device, DeviceProfile, RayDefault, SimJob, Strategy, WorkloadRate, bounds, simulate,
)

ROOT = Path(__file__).resolve().parents[2]


def device(node: str, kind: str, items_per_s: float, watts: float, *, slots: int = 1, cpus: int = 4,
           workload: str = "w") -> Device:
    profile = DeviceProfile(name=node, kind=BackendName(kind), slots=slots, host_cpus=cpus, idle_w=1.0,
                            workloads={workload: WorkloadRate(items_per_s=items_per_s, active_w=watts)})
    return Device(node_id=node, profile=profile)


GPU = device("gpu", "cuda", 1000, 100)  # 10 items/J
CPU = device("cpu", "cpu", 100, 50)  # 2 items/J
MAC = device("mac", "ane", 300, 10)  # 30 items/J
MAC2 = device("mac2", "ane", 300, 10)
FLEET = [GPU, CPU, MAC, MAC2]


def job(name: str, items: int, shards: int, *, deadline: float | None = None, at: float = 0.0) -> SimJob:
    policy = Policy.DEADLINE if deadline is not None else Policy.EFFICIENCY
    return SimJob(name=name, workload="w", items=items, shards=shards, policy=policy, deadline_s=deadline, arrival_s=at)


MIX = [job("a", 800, 8), job("b", 1000, 10, at=0.5), job("c", 2300, 7, at=1.0), job("d", 400, 4, at=4.0)]
DEADLINED = [job("a", 800, 8), job("b", 1000, 10, deadline=2.0, at=0.5), job("c", 2300, 7, deadline=3.0, at=1.0)]


def test_the_milp_optimum_is_at_most_every_strategys_energy_on_a_small_case() -> None:
    best = bounds(FLEET, MIX)
    for strategy in Strategy:
        assert best.energy_j <= simulate(FLEET, MIX, strategy).energy_j + 1e-9, strategy
    # With deadlines: no strategy that meets them all uses less than the deadline-bound optimum.
    best = bounds(FLEET, DEADLINED)
    assert all(best.idle_feasible.values())
    keepers = [r for r in (simulate(FLEET, DEADLINED, s) for s in Strategy) if r.deadlines_met == r.deadlines]
    assert {r.strategy for r in keepers} >= {"farm-deadline", "milp"}
    assert all(best.energy_deadlines_j <= r.energy_j + 1e-9 for r in keepers)
    assert best.energy_j < best.energy_deadlines_j  # the deadlines do cost energy here
    assert all(best.makespan_s <= r.makespan_s + 1e-9 for r in (simulate(FLEET, MIX, s) for s in Strategy))


def test_the_milp_is_exact_against_brute_force() -> None:
    devices = [GPU, CPU, MAC]
    single = job("x", 23, 5, deadline=0.1)  # shards of 5, 5, 5, 4, 4 items
    sizes = single.shard_items
    best = None
    for choice in itertools.product(range(3), repeat=len(sizes)):
        seconds = [sum(s for s, c in zip(sizes, choice, strict=True) if c == d) / devices[d].rate("w").items_per_s
                   for d in range(3)]
        if max(seconds) <= 0.1 + 1e-9:
            energy = sum(s / devices[c].rate("w").items_per_j for s, c in zip(sizes, choice, strict=True))
            best = energy if best is None else min(best, energy)
    assert best is not None
    assert bounds(devices, [single]).energy_deadlines_j == pytest.approx(best)


def test_the_milp_strategy_takes_the_earliest_finish_among_least_energy_assignments() -> None:
    (result,) = simulate(FLEET, [job("a", 800, 8)], Strategy.MILP).jobs
    assert result.quotas == {"mac": 4, "mac2": 4}  # twins: the same energy either way, so it halves the time
    assert result.energy_j == pytest.approx(800 / 30)
    assert result.makespan_s == pytest.approx(400 / 300)


def test_efficiency_equals_the_optimum_when_there_is_no_deadline() -> None:
    result = simulate(FLEET, MIX, Strategy.EFFICIENCY)
    assert result.energy_j == pytest.approx(bounds(FLEET, MIX).energy_j)
    assert all(set(j.quotas) <= {"mac", "mac2"} for j in result.jobs)  # only on the most efficient devices


def test_deadline_policy_meets_what_it_can_and_reports_what_it_cannot() -> None:
    jobs = [job("a", 800, 8), job("tight", 1000, 10, deadline=1.05, at=0.5),
            job("impossible", 1000, 10, deadline=0.1, at=5.0)]
    result = {j.name: j for j in simulate(FLEET, jobs, Strategy.DEADLINE).jobs}
    assert result["tight"].met and result["tight"].feasible
    assert result["tight"].quotas == {"gpu": 10}  # the Macs are busy with a until 1.33 s: too late
    assert result["impossible"].feasible is False and result["impossible"].met is False
    assert "no plan meets deadline_s=0.1" in result["impossible"].why
    assert bounds(FLEET, jobs).idle_feasible == {"tight": True, "impossible": False}


def test_deadline_policy_meets_every_feasible_deadline_in_the_benchmark_scenario() -> None:
    bench = _benchmark()
    devices = bench.fleet(bench.load_profiles())
    jobs = bench.job_mix(devices)
    result = simulate(devices, jobs, Strategy.DEADLINE)
    deadlined = [r for r in result.jobs if r.deadline_s is not None]
    assert len(deadlined) >= 4
    assert all(r.met for r in deadlined if r.feasible)
    infeasible = [r for r in deadlined if not r.feasible]
    assert infeasible and all(not r.met and "no plan meets" in r.why for r in infeasible)


def test_round_robin_cycles_over_the_devices_across_jobs() -> None:
    fast, slow = device("fast", "cuda", 1000, 100), device("slow", "cpu", 100, 50)
    jobs = [job("a", 500, 5), job("b", 300, 3, at=10.0)]
    a, b = simulate([fast, slow], jobs, Strategy.ROUND_ROBIN).jobs
    assert a.quotas == {"fast": 3, "slow": 2}
    assert a.makespan_s == pytest.approx(2.0)  # two 100-item shards back to back on the slow device
    assert b.quotas == {"slow": 2, "fast": 1}  # the cycle goes on where a left it: slow, fast, slow


def test_fastest_first_takes_the_fastest_free_device() -> None:
    fast, slow = device("fast", "cuda", 1000, 100), device("slow", "cpu", 100, 50)
    (result,) = simulate([fast, slow], [job("a", 400, 4)], Strategy.FASTEST_FIRST).jobs
    # t=0: fast takes one, slow (the only free one) the next; fast then takes each shard as it frees up.
    assert result.quotas == {"fast": 3, "slow": 1}
    assert result.makespan_s == pytest.approx(1.0)
    (alone,) = simulate([fast, slow], [job("a", 100, 1)], Strategy.FASTEST_FIRST).jobs
    assert alone.quotas == {"fast": 1}


def test_ray_default_packs_in_node_id_order_then_spreads_and_avoids_gpu_nodes() -> None:
    a, b = device("a", "ane", 1, 10, cpus=4), device("b", "cpu", 1, 10, cpus=4)
    g = device("g", "cuda", 1000, 100, cpus=4)
    ray = RayDefault(node_order=("g", "a", "b"))  # 3 nodes + the head: k = max(1, int(4 × 0.2)) = 1, no randomness

    def quotas(shards: int, model: RayDefault = ray) -> dict[str, int]:
        return simulate([a, b, g], [job("j", shards * 100, shards)], Strategy.RAY_DEFAULT, ray=model).jobs[0].quotas

    assert quotas(2) == {"a": 2}  # packs: a stays below the 50% threshold until its second CPU is taken
    assert quotas(3) == {"a": 2, "b": 1}  # then spreads to b, still at 0%
    assert quotas(6) == {"a": 3, "b": 3}  # then the least utilised; the GPU node is avoided while others have room
    assert quotas(9) == {"a": 4, "b": 4, "g": 1}  # only when every other node is full
    assert quotas(2, RayDefault(node_order=("g", "a", "b"), avoid_gpu_nodes=False)) == {"g": 2}
    spread = RayDefault(node_order=("g", "a", "b"), spread_threshold=0.0, avoid_gpu_nodes=False)
    assert quotas(3, spread) == {"g": 1, "a": 1, "b": 1}  # without the threshold: the least utilised from the start


def test_ray_default_is_deterministic_for_a_seed() -> None:
    jobs = [job("a", 800, 8), job("b", 1000, 10, at=0.5)]
    runs = [simulate(FLEET, jobs, Strategy.RAY_DEFAULT, seed=3) for _ in range(2)]
    assert runs[0] == runs[1]


def test_energy_is_active_power_times_busy_time() -> None:
    (result,) = simulate([CPU], [job("a", 300, 3)], Strategy.EFFICIENCY).jobs
    assert result.energy_j == pytest.approx(50 * 3.0)  # 50 W for 300 items at 100 items/s; idle power not counted
    assert result.makespan_s == pytest.approx(3.0)


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scheduler_policies", ROOT / "benchmarks" / "scheduler_policies.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
