"""Scheduler policies on a mixed fleet: energy, makespan and deadlines met, strategy by strategy.

    python benchmarks/scheduler_policies.py [--seed N] [--jobs N]

The fleet: 2 H200 boxes, 3 M2 Pro Macs (Neural Engine), 4 i7-1185G7 laptops (CPU), 1 RTX 4090 desktop, from the
recorded profiles in tests/fixtures/profiles/ (each number's origin is in its "notes"). The job mix: digits-cnn and
minilm-embed jobs arriving at random (seeded) over a few minutes, a third of them with a deadline, one of those
deliberately impossible. Energy is what Farm's meters attribute to the work (active power × run time); see
farm/scheduler/simulator.py for the model and for what each strategy does.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from farm.core.spec import Policy
from farm.scheduler.simulator import (
    Bounds, Device, DeviceProfile, RayDefault, SimJob, SimResult, Strategy, bounds, simulate,
)

PROFILES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "profiles"
FLEET = (("h200-a", "h200"), ("h200-b", "h200"), ("mac-1", "m2-pro-ane"), ("mac-2", "m2-pro-ane"),
         ("mac-3", "m2-pro-ane"), ("laptop-1", "i7-1185g7-cpu"), ("laptop-2", "i7-1185g7-cpu"),
         ("laptop-3", "i7-1185g7-cpu"), ("laptop-4", "i7-1185g7-cpu"), ("rtx-4090", "rtx-4090"))
RAY_SEEDS = range(20)  # Ray's choices are random: its row uses seed 0, the spread over these is printed below it


def load_profiles(folder: Path = PROFILES) -> dict[str, DeviceProfile]:
    return {p.stem: DeviceProfile.model_validate(json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))}


def fleet(profiles: dict[str, DeviceProfile]) -> list[Device]:
    return [Device(node_id=node, profile=profiles[name]) for node, name in FLEET]


def job_mix(devices: list[Device], seed: int = 7, count: int = 24) -> list[SimJob]:
    """Jobs arriving about every 20 s. A deadline job's deadline is 3/10 to 7/10 of the time the single most
    efficient device would take, so meeting it needs faster, hungrier devices; the fourth
    deadline job gets half the time the whole fleet would need even perfectly shared, to show how an impossible one
    is reported."""
    rng = random.Random(seed)
    jobs, t, deadlines = [], 0.0, 0
    for k in range(count):
        t += rng.expovariate(1 / 20)
        if rng.random() < 0.5:
            workload, items, shards = "digits-cnn", rng.choice([200_000, 500_000, 1_000_000, 2_000_000]), 16
        else:
            workload, items, shards = "minilm-embed", rng.choice([20_000, 50_000, 100_000]), rng.choice([8, 16])
        policy, deadline = (Policy.THROUGHPUT if rng.random() < 0.25 else Policy.EFFICIENCY), None
        if rng.random() < 1 / 3:
            capable = [d for d in devices if d.runs(workload)]
            greenest = max((d.rate(workload) for d in capable), key=lambda r: (r.items_per_j, r.items_per_s))
            whole_fleet = sum(d.rate(workload).items_per_s * d.profile.slots for d in capable)
            deadlines += 1
            seconds = (items / whole_fleet / 2 if deadlines == 4  # half what the whole fleet, perfectly shared, needs
                       else items / greenest.items_per_s * rng.uniform(0.3, 0.7))
            policy, deadline = Policy.DEADLINE, round(seconds, 2)
        jobs.append(SimJob(name=f"{k:02d}-{workload.split('-')[0]}", workload=workload, items=items, shards=shards,
                           policy=policy, deadline_s=deadline, arrival_s=round(t, 1)))
    return jobs


def table(results: list[SimResult], best: Bounds, devices: list[Device]) -> str:
    kinds = {d.node_id: d.profile.kind.value for d in devices}
    lines = [f"{'strategy':<16} {'energy J':>12} {'× optimum':>10} {'makespan s':>11} {'deadlines met':>14}   "
             "shards on cuda/ane/cpu"]
    for r in results:
        where = {"cuda": 0, "ane": 0, "cpu": 0}
        for job in r.jobs:
            for node, n in job.quotas.items():
                where[kinds[node]] = where.get(kinds[node], 0) + n
        lines.append(f"{r.strategy:<16} {r.energy_j:>12,.0f} {r.energy_j / best.energy_deadlines_j:>10.3f} "
                     f"{r.makespan_s:>11,.1f} {f'{r.deadlines_met}/{r.deadlines}':>14}   "
                     f"{where['cuda']}/{where['ane']}/{where['cpu']}")
    lines.append(f"{'optimum (milp)':<16} {best.energy_deadlines_j:>12,.0f} {1:>10.3f} {best.makespan_s:>11,.1f}"
                 f" {'bound':>14}   energy: least that meets every deadline an idle fleet can; makespan: a lower bound")
    lines.append(f"{'  no deadlines':<16} {best.energy_j:>12,.0f} {best.energy_j / best.energy_deadlines_j:>10.3f}"
                 f" {'':>11} {'':>14}   least energy ignoring deadlines")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7, help="the job mix's seed")
    parser.add_argument("--jobs", type=int, default=24)
    args = parser.parse_args(argv)
    devices = fleet(load_profiles())
    jobs = job_mix(devices, args.seed, args.jobs)
    best = bounds(devices, jobs)
    results = [simulate(devices, jobs, s, seed=0) for s in Strategy]
    by = {r.strategy: r for r in results}
    print(f"{len(jobs)} jobs ({sum(j.deadline_s is not None for j in jobs)} with a deadline, "
          f"{sum(best.idle_feasible.values())} of them feasible on an idle fleet) on {len(devices)} devices; "
          f"job-mix seed {args.seed}\n")
    print(table(results, best, devices))

    efficiency, deadline, ray = by[Strategy.EFFICIENCY], by[Strategy.DEADLINE], by[Strategy.RAY_DEFAULT]
    ray_runs = [simulate(devices, jobs, Strategy.RAY_DEFAULT, seed=s).energy_j for s in RAY_SEEDS]
    print(f"\nray-default over {len(RAY_SEEDS)} seeds (node-id order, top-k picks): energy "
          f"min {min(ray_runs):,.0f} / median {statistics.median(ray_runs):,.0f} / max {max(ray_runs):,.0f} J")
    print("\nratios")
    print(f"  farm-efficiency / optimum ignoring deadlines      {efficiency.energy_j / best.energy_j:.3f}")
    print(f"  farm-efficiency / optimum meeting deadlines       {efficiency.energy_j / best.energy_deadlines_j:.3f}"
          f"   (efficiency ignores deadlines: it met {efficiency.deadlines_met}/{efficiency.deadlines})")
    print(f"  farm-deadline   / optimum meeting deadlines       {deadline.energy_j / best.energy_deadlines_j:.3f}")
    print(f"  ray-default     / farm-efficiency                 {ray.energy_j / efficiency.energy_j:.2f}"
          f"   (over the seeds: {min(ray_runs) / efficiency.energy_j:.2f} to "
          f"{max(ray_runs) / efficiency.energy_j:.2f})")
    print(f"  ray-default     / farm-deadline                   {ray.energy_j / deadline.energy_j:.2f}")
    spread_to_gpus = simulate(devices, jobs, Strategy.RAY_DEFAULT, seed=0, ray=RayDefault(avoid_gpu_nodes=False))
    print(f"  ray-default with RAY_scheduler_avoid_gpu_nodes=0 / farm-efficiency  "
          f"{spread_to_gpus.energy_j / efficiency.energy_j:.2f}")

    print("\nfarm-deadline, deadline jobs (feasible: the fleet as queued at arrival could meet it; idle: an idle one)")
    for job, r in zip(jobs, deadline.jobs, strict=True):
        if job.deadline_s is None:
            continue
        verdict = "met" if r.met else "MISSED"
        print(f"  {job.name:<10} deadline {job.deadline_s:>7.1f} s  took {r.makespan_s:>7.1f} s  {verdict:<6} "
              f"feasible={r.feasible!s:<5} idle={best.idle_feasible[job.name]!s:<5} {r.why}")

    within = abs(efficiency.energy_j / best.energy_j - 1) <= 0.05
    halved = ray.energy_j >= 2 * efficiency.energy_j
    kept = all(r.met for r in deadline.jobs if r.feasible)
    idle_kept = all(r.met for job, r in zip(jobs, deadline.jobs, strict=True) if best.idle_feasible.get(job.name))
    print("\ntargets")
    print(f"  efficiency within 5% of the optimum (least energy):        {'met' if within else 'NOT met'}")
    print(f"  efficiency at least 2x lower than ray-default:             {'met' if halved else 'NOT met'}")
    print(f"  deadline policy meets every deadline feasible at arrival:  {'met' if kept else 'NOT met'}")
    print(f"  deadline policy meets every deadline an idle fleet could:  {'met' if idle_kept else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
