"""A fleet simulator: what a job mix costs in energy and time under each way of placing its shards.

A benchmark harness, not a second scheduler: it replays jobs on device profiles and asks each strategy where the
shards go. Pure (typed, no I/O): profiles and jobs come in as models, results go out as models.

The model
- A fleet is a list of devices; each is one Ray node (Farm starts one Ray worker node per agent) with `slots` shards
  running at once, each at the profile's items/s for the job's workload.
- Jobs are taken in arrival order. A *planned* strategy decides at a job's arrival where all its shards go, from the
  work already queued on each device (Farm's `plan`, round-robin, the per-job MILP). A *dispatched* strategy hands a
  waiting shard to a device when that device can take one (fastest-first, Ray's default). Either way a device runs
  the shards it was given first come, first served, each on its earliest free slot; nothing is pre-empted. A shard
  takes items ÷ items/s: task start, model loading and data transfer are not modelled.
- Energy is what Farm's meters attribute to the work: the device's active power (board or package power while it
  runs a shard, idle floor included, as an energy counter read over the shard sees it) times the shard's run time,
  i.e. items / (items per joule). Idle power between shards is not counted: Farm's devices are spare machines that are
  powered whether or not Farm uses them, so their idle draw is not caused by a placement, and charging it would make
  every strategy pay for the whole fleet's standby. Profiles keep `idle_w` for a caller that wants to add it.

Strategies (`Strategy`)
- farm, farm-efficiency, farm-throughput, farm-deadline: `farm.scheduler.plan.plan` per job, with each job's own
  policy (farm) or one policy forced on every job. Devices are `DeviceRate`s with items_per_j = items/s ÷ active W
  and busy_s = until the device's last queued shard ends.
- milp: per job, the exact assignment problem (scipy.optimize.milp) on the queues as they stand: least energy within
  the deadline (without one: least energy), and among those the earliest finish; where no assignment meets the
  deadline, the earliest finish.
- round-robin: shard after shard onto the next device in a fixed cycle (the cycle carries over between jobs).
- fastest-first: a waiting shard goes to the device with the most items/s among those with a free slot.
- ray-default: Ray's default (hybrid) policy for tasks that ask for the default 1 CPU; see `RayDefault`.

`bounds` gives what no strategy can beat: the least energy (per job, the assignment problem on an idle fleet, with or
without the deadlines) and a lower bound on the mix's makespan.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Sequence
from enum import StrEnum

import numpy as np
from pydantic import Field
from scipy.optimize import Bounds as VarBounds
from scipy.optimize import LinearConstraint, milp

from farm.core.errors import UserError
from farm.core.frozen import Frozen
from farm.core.models import BackendName
from farm.core.spec import Policy, shard_ranges
from farm.scheduler.plan import DeviceRate, plan

EPS = 1e-9  # seconds of slack when comparing a finish time with a deadline
Placed = tuple[int, int, int | None]  # a shard's items, its device's index, its slot (None: the earliest free one)


class WorkloadRate(Frozen):
    """What one slot of a device does on one workload."""

    items_per_s: float = Field(gt=0)
    active_w: float = Field(gt=0)
    notes: str = ""

    @property
    def items_per_j(self) -> float:
        return self.items_per_s / self.active_w


class DeviceProfile(Frozen):
    name: str
    kind: BackendName
    slots: int = Field(default=1, ge=1)
    host_cpus: int = Field(default=1, ge=1)  # logical CPUs its Ray node advertises: all Ray's default placement sees
    idle_w: float = Field(ge=0)
    power_scope: str = "device"  # device | package | system, as Farm's energy figures carry it
    workloads: dict[str, WorkloadRate]
    notes: tuple[str, ...] = ()


class Device(Frozen):
    """One device of the fleet: a profile on a named node."""

    node_id: str
    profile: DeviceProfile

    def runs(self, workload: str) -> bool:
        return workload in self.profile.workloads

    def rate(self, workload: str) -> WorkloadRate:
        if workload not in self.profile.workloads:
            raise UserError(f"device {self.node_id}: no profile for workload {workload!r}")
        return self.profile.workloads[workload]


class SimJob(Frozen):
    name: str
    workload: str
    items: int = Field(ge=1)
    shards: int = Field(ge=1)
    policy: Policy = Policy.EFFICIENCY
    deadline_s: float | None = Field(default=None, gt=0)  # from arrival
    arrival_s: float = Field(default=0.0, ge=0)

    @property
    def shard_items(self) -> list[int]:
        """Items per shard, largest first, as Farm cuts them."""
        return sorted((stop - start for start, stop in shard_ranges(self.items, self.shards)), reverse=True)


class JobResult(Frozen):
    name: str
    energy_j: float
    finish_s: float  # absolute
    makespan_s: float  # from arrival to the last shard's end
    deadline_s: float | None = None
    met: bool | None = None  # None: no deadline
    feasible: bool | None = None  # deadline jobs under a planned strategy: could the queues at arrival meet it at all
    quotas: dict[str, int]  # node id → shards
    why: str = ""  # what the planner said, e.g. that no plan meets the deadline


class SimResult(Frozen):
    strategy: str
    jobs: tuple[JobResult, ...]

    @property
    def energy_j(self) -> float:
        return sum(j.energy_j for j in self.jobs)

    @property
    def makespan_s(self) -> float:
        """From the first arrival to the last shard's end."""
        if not self.jobs:
            return 0.0
        return max(j.finish_s for j in self.jobs) - min(j.finish_s - j.makespan_s for j in self.jobs)

    @property
    def deadlines(self) -> int:
        return sum(j.met is not None for j in self.jobs)

    @property
    def deadlines_met(self) -> int:
        return sum(j.met is True for j in self.jobs)


class Strategy(StrEnum):
    FARM = "farm"
    EFFICIENCY = "farm-efficiency"
    THROUGHPUT = "farm-throughput"
    DEADLINE = "farm-deadline"
    MILP = "milp"
    ROUND_ROBIN = "round-robin"
    FASTEST_FIRST = "fastest-first"
    RAY_DEFAULT = "ray-default"


class RayDefault(Frozen):
    """Ray's DEFAULT scheduling strategy (the hybrid policy) for tasks that ask for the default {"CPU": 1}.

    Modelled after ray-project/ray src/ray/raylet/scheduling/policy/hybrid_scheduling_policy.cc and the defaults in
    src/ray/common/ray_config_def.h (RAY_scheduler_spread_threshold and friends):
    - a node's score is its critical resource utilisation (the highest of CPU, memory and object-store use; a default
      task uses only CPU, so CPUs in use ÷ CPUs), truncated to 0 below `spread_threshold`;
    - nodes with a free CPU come first; among them nodes are sorted by node id, then stably by score, and one of the
      top k is picked at random, k = max(top_k_absolute, int(cluster nodes × top_k_fraction)); so tasks pack onto
      the first nodes in id order until they pass the threshold, then go to the least utilised;
    - a request with no GPU is first tried on nodes without a GPU (scheduler_avoid_gpu_nodes), then on any node;
    - the preferred (local) node is the driver's: Farm's head, a Ray node started with --num-cpus 0, so it is never
      feasible and never preferred; it still counts among the cluster's nodes for k (`extra_nodes`).
    Simplifications: node ids are a seeded random order (real ids are random too); a task that finds no node with a
    free CPU waits in one queue for the next to free up (Ray may instead queue it at a busy node); data locality is
    ignored (a shard's arguments are a few integers). A node admits up to its host's CPUs in shards at once; they
    share its one device, which runs them back to back (the same busy time as sharing it).
    """

    spread_threshold: float = 0.5  # RAY_scheduler_spread_threshold
    top_k_fraction: float = 0.2  # RAY_scheduler_top_k_fraction
    top_k_absolute: int = 1  # RAY_scheduler_top_k_absolute
    avoid_gpu_nodes: bool = True  # RAY_scheduler_avoid_gpu_nodes
    extra_nodes: int = 1  # Farm's head node: in the cluster, never feasible
    node_order: tuple[str, ...] = ()  # node ids in Ray's node-id order; empty: a random order drawn from the seed


class Bounds(Frozen):
    energy_j: float  # least energy, deadlines ignored: no placement uses less
    energy_deadlines_j: float  # least energy meeting every deadline an idle fleet can meet: no placement that does
    makespan_s: float  # no placement finishes the mix sooner (from the first arrival)
    idle_feasible: dict[str, bool]  # per deadline job: can the fleet, idle, meet it


# --------------------------------------------------------------------------------------------------- simulation


def simulate(devices: Sequence[Device], jobs: Sequence[SimJob], strategy: Strategy, *, seed: int = 0,
             ray: RayDefault = RayDefault()) -> SimResult:
    """Replay `jobs` on `devices` under `strategy`. `seed` drives Ray's random choices and node-id order only."""
    _check(devices, jobs)
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival_s)
    if strategy in (Strategy.FASTEST_FIRST, Strategy.RAY_DEFAULT):
        results = _dispatched(devices, jobs, order, strategy, random.Random(seed), ray)
    else:
        results = _planned(devices, jobs, order, strategy)
    return SimResult(strategy=strategy.value, jobs=tuple(results[i] for i in range(len(jobs))))


def _check(devices: Sequence[Device], jobs: Sequence[SimJob]) -> None:
    if len({d.node_id for d in devices}) != len(devices):
        raise UserError("fleet: node ids must be unique")
    for job in jobs:
        if not any(d.runs(job.workload) for d in devices):
            raise UserError(f"job {job.name}: no device has a profile for workload {job.workload!r}")


class _Fleet:
    """Each device's slots: when each is next free (absolute seconds)."""

    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices = devices
        self.free = [[0.0] * d.profile.slots for d in devices]

    def run(self, job: SimJob, now: float, placed: Sequence[Placed]) -> tuple[float, float, dict[str, int]]:
        """Queue shards (items, device, slot or None for its earliest free slot); return finish, energy, quotas."""
        finish, energy, quotas = now, 0.0, Counter[str]()
        for items, d, slot in placed:
            rate = self.devices[d].rate(job.workload)
            slots = self.free[d]
            s = min(range(len(slots)), key=slots.__getitem__) if slot is None else slot
            slots[s] = max(slots[s], now) + items / rate.items_per_s
            finish = max(finish, slots[s])
            energy += items / rate.items_per_j
            quotas[self.devices[d].node_id] += 1
        return finish, energy, dict(quotas)


def _result(job: SimJob, now: float, finish: float, energy: float, quotas: dict[str, int], *,
            feasible: bool | None = None, why: str = "") -> JobResult:
    met = None if job.deadline_s is None else finish - now <= job.deadline_s + EPS
    return JobResult(name=job.name, energy_j=energy, finish_s=finish, makespan_s=finish - now,
                     deadline_s=job.deadline_s, met=met, feasible=feasible, quotas=quotas, why=why)


def _planned(devices: Sequence[Device], jobs: Sequence[SimJob], order: Sequence[int],
             strategy: Strategy) -> dict[int, JobResult]:
    fleet, cursor, results = _Fleet(devices), 0, {}
    for i in order:
        job, now = jobs[i], jobs[i].arrival_s
        capable = [d for d, device in enumerate(devices) if device.runs(job.workload)]
        # Whether the fleet as queued can meet the deadline at all: the exact answer, to judge the strategies by.
        within = None if job.deadline_s is None else _solve(job, fleet, capable, now, job.deadline_s, makespan=False)
        feasible = None if job.deadline_s is None else within is not None
        why = ""
        if strategy is Strategy.MILP:
            # Least energy within the deadline; where none meets it, the earliest finish; without one, least energy.
            placed = within or _solve(job, fleet, capable, now, None, makespan=job.deadline_s is not None)
            if placed is None:
                raise UserError(f"job {job.name}: the MILP found no assignment")
        elif strategy is Strategy.ROUND_ROBIN:
            placed = []
            for items in job.shard_items:
                while not devices[cursor % len(devices)].runs(job.workload):
                    cursor += 1
                placed.append((items, cursor % len(devices), None))
                cursor += 1
        else:
            placed, why = _farm_plan(job, fleet, capable, now, strategy)
        finish, energy, quotas = fleet.run(job, now, placed)
        results[i] = _result(job, now, finish, energy, quotas, feasible=feasible, why=why)
    return results


def _farm_plan(job: SimJob, fleet: _Fleet, capable: Sequence[int], now: float,
               strategy: Strategy) -> tuple[list[Placed], str]:
    policy = {Strategy.EFFICIENCY: Policy.EFFICIENCY, Strategy.THROUGHPUT: Policy.THROUGHPUT,
              Strategy.DEADLINE: Policy.DEADLINE if job.deadline_s is not None else Policy.EFFICIENCY,
              }.get(strategy, job.policy)
    rates, index = [], {}
    for d in capable:
        device = fleet.devices[d]
        rate = device.rate(job.workload)
        # plan takes one busy_s per device for all its slots: the latest is the safe one (never promises too much).
        rates.append(DeviceRate(node_id=device.node_id, device=device.profile.kind.value, slots=device.profile.slots,
                                items_per_s=rate.items_per_s, items_per_j=rate.items_per_j,
                                busy_s=max(0.0, max(fleet.free[d]) - now)))
        index[rates[-1].key] = d
    result = plan(job.shard_items, rates, policy, job.deadline_s)
    # plan gives counts per device; hand out the shards, largest first, to devices in plan's own order of preference.
    preference = sorted(rates, key=lambda r: (-(r.items_per_j or 0.0), -r.items_per_s))
    shards = iter(job.shard_items)
    placed: list[Placed] = []
    for chosen in preference:
        placed += [(next(shards), index[chosen.key], None) for _ in range(result.quotas.get(chosen.key, 0))]
    return placed, result.why


def _dispatched(devices: Sequence[Device], jobs: Sequence[SimJob], order: Sequence[int], strategy: Strategy,
                rng: random.Random, ray: RayDefault) -> dict[int, JobResult]:
    """Event-driven: shards wait in one queue (arrival order) and start when the strategy finds them a device."""
    fleet = _Fleet(devices)
    ray_mode = strategy is Strategy.RAY_DEFAULT
    capacity = [d.profile.host_cpus if ray_mode else d.profile.slots for d in devices]
    ids = [d.node_id for d in devices]
    by_id = [ids.index(node) for node in ray.node_order] if ray.node_order else rng.sample(range(len(ids)), len(ids))
    if sorted(by_id) != list(range(len(ids))):
        raise UserError("ray.node_order must name every node of the fleet once")
    rank = {d: r for r, d in enumerate(by_id)}  # Ray breaks ties by node id
    used = [0] * len(devices)
    ends: list[tuple[float, int]] = []  # (when a shard ends, its device): frees a unit of capacity
    waiting: deque[tuple[int, int]] = deque()  # (job index, items)
    placed: dict[int, list[tuple[float, float, str]]] = {i: [] for i in order}  # per job: (finish, energy, node)
    arrivals, t = deque(order), jobs[order[0]].arrival_s if order else 0.0
    while arrivals or waiting:
        while ends and ends[0][0] <= t:
            used[heapq.heappop(ends)[1]] -= 1
        while arrivals and jobs[arrivals[0]].arrival_s <= t:
            i = arrivals.popleft()
            waiting.extend((i, items) for items in jobs[i].shard_items)
        for entry in list(waiting):
            i, items = entry
            job = jobs[i]
            free = [d for d, device in enumerate(devices) if used[d] < capacity[d] and device.runs(job.workload)]
            if not free:
                continue
            if ray_mode:
                d = _ray_pick(free, devices, used, capacity, rank, rng, ray)
            else:
                d = max(free, key=lambda d: (devices[d].rate(job.workload).items_per_s, -d))
            finish, energy, _ = fleet.run(job, t, [(items, d, None)])
            used[d] += 1
            heapq.heappush(ends, (finish, d))
            placed[i].append((finish, energy, devices[d].node_id))
            waiting.remove(entry)
        upcoming = [ends[0][0]] if ends else []
        upcoming += [jobs[arrivals[0]].arrival_s] if arrivals else []
        if not upcoming:
            break
        t = max(t, min(upcoming))
    results = {}
    for i in order:
        job = jobs[i]
        finish = max(f for f, _, _ in placed[i])
        quotas = dict(Counter(node for _, _, node in placed[i]))
        results[i] = _result(job, job.arrival_s, finish, sum(e for _, e, _ in placed[i]), quotas)
    return results


def _ray_pick(free: Sequence[int], devices: Sequence[Device], used: Sequence[int], capacity: Sequence[int],
              rank: dict[int, int], rng: random.Random, ray: RayDefault) -> int:
    def score(d: int) -> float:
        utilisation = used[d] / capacity[d]
        return utilisation if utilisation >= ray.spread_threshold else 0.0

    candidates = list(free)
    if ray.avoid_gpu_nodes:
        candidates = [d for d in free if devices[d].profile.kind is not BackendName.CUDA] or candidates
    candidates.sort(key=lambda d: (score(d), rank[d]))
    k = max(ray.top_k_absolute, int((len(devices) + ray.extra_nodes) * ray.top_k_fraction))
    return candidates[rng.randrange(min(k, len(candidates)))]


# --------------------------------------------------------------------------------------------------- the exact optimum


def _solve(job: SimJob, fleet: _Fleet, capable: Sequence[int], now: float, deadline_s: float | None, *,
           makespan: bool) -> list[Placed] | None:
    """The job's assignment problem on the queues as they stand, solved exactly: integer shards of each size per
    slot. Least energy (within `deadline_s` of `now` when given; among the least-energy assignments, the earliest
    finish), or the earliest finish when `makespan`. None when no assignment meets the deadline."""
    problem = _Problem(job, fleet, capable, now)
    if makespan:
        x = problem.solve(problem.finish_objective(), deadline_s)
    else:
        x = problem.solve(problem.joules, deadline_s)
        if x is not None:
            x = _first(problem.solve(problem.finish_objective(), deadline_s, energy_cap=float(problem.joules @ x)), x)
    return None if x is None else problem.placed(x)


def _first(x: np.ndarray | None, fallback: np.ndarray) -> np.ndarray:
    return fallback if x is None else x


class _Problem:
    """Variables: x[s·c + k] shards of size sizes[k] on slot s; u[s] slot s used; T the job's finish from now."""

    def __init__(self, job: SimJob, fleet: _Fleet, capable: Sequence[int], now: float) -> None:
        self.slots = [(d, s) for d in capable for s in range(len(fleet.free[d]))]
        rates = [fleet.devices[d].rate(job.workload) for d, _ in self.slots]
        self.counts = Counter(job.shard_items)
        self.sizes = np.array(sorted(self.counts, reverse=True), dtype=float)
        self.n, self.c = len(self.slots), len(self.sizes)
        self.size = self.n * self.c + self.n + 1
        self.start = np.array([max(fleet.free[d][s] - now, 0.0) for d, s in self.slots])
        self.work = np.zeros((self.n, self.size))  # seconds of the job's work on each slot
        self.joules = np.zeros(self.size)
        for s, rate in enumerate(rates):
            self.work[s, s * self.c:(s + 1) * self.c] = self.sizes / rate.items_per_s
            self.joules[s * self.c:(s + 1) * self.c] = self.sizes / rate.items_per_j

    def finish_objective(self) -> np.ndarray:
        objective = np.zeros(self.size)
        objective[-1] = 1.0
        return objective

    def placed(self, x: np.ndarray) -> list[Placed]:
        """(items, device, slot) for every shard of a solution."""
        n, c = self.n, self.c
        counts = np.rint(x[:n * c]).astype(int)
        return [(int(items), self.slots[s][0], self.slots[s][1]) for s in range(n) for k, items in enumerate(self.sizes)
                for _ in range(counts[s * c + k])]

    def solve(self, objective: np.ndarray, deadline_s: float | None, energy_cap: float | None = None
              ) -> np.ndarray | None:
        n, c, size = self.n, self.c, self.size
        rows: list[np.ndarray] = []
        lo: list[float] = []
        hi: list[float] = []

        def add(row: np.ndarray, low: float, high: float) -> None:
            rows.append(row)
            lo.append(low)
            hi.append(high)

        upper = np.full(size, np.inf)
        upper[n * c:n * c + n] = 1
        for k, items in enumerate(self.sizes):
            row = np.zeros(size)
            row[k:n * c:c] = 1
            add(row, self.counts[int(items)], self.counts[int(items)])  # every shard placed once
        for s in range(n):
            row = self.work[s].copy()
            row[n * c + s], row[-1] = self.start[s], -1.0
            add(row, -np.inf, 0.0)  # T ≥ start·used + work
            for k, items in enumerate(self.sizes):
                row = np.zeros(size)
                row[s * c + k], row[n * c + s] = 1.0, -self.counts[int(items)]
                add(row, -np.inf, 0.0)  # shards only on used slots
        if deadline_s is not None:
            upper[-1] = deadline_s + EPS
        if energy_cap is not None:
            add(self.joules, -np.inf, energy_cap * (1 + 1e-9) + 1e-9)
        integrality = np.ones(size)
        integrality[-1] = 0
        result = milp(objective, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality,
                      bounds=VarBounds(np.zeros(size), upper))
        if result.status != 0 or result.x is None:
            return None
        return np.asarray(result.x)


def bounds(devices: Sequence[Device], jobs: Sequence[SimJob]) -> Bounds:
    """What no strategy beats. Energy: each job's assignment problem on an idle fleet (jobs do not interact in
    energy, and a busy fleet only removes choices). Makespan: the later of each job's fastest finish on an idle fleet
    and the fluid bound that spreads all the mix's items over the whole fleet from the first arrival."""
    _check(devices, jobs)
    energy = energy_deadlines = 0.0
    feasible: dict[str, bool] = {}
    latest = 0.0
    first = min((j.arrival_s for j in jobs), default=0.0)
    for job in jobs:
        idle = _Fleet(devices)
        capable = [d for d, device in enumerate(devices) if device.runs(job.workload)]
        cheapest = _energy(job, devices, _solve(job, idle, capable, 0.0, None, makespan=False))
        energy += cheapest
        if job.deadline_s is not None:
            within = _solve(job, idle, capable, 0.0, job.deadline_s, makespan=False)
            feasible[job.name] = within is not None
            energy_deadlines += cheapest if within is None else _energy(job, devices, within)
        else:
            energy_deadlines += cheapest
        fastest = _solve(job, idle, capable, 0.0, None, makespan=True)
        if fastest is not None:
            finish, _, _ = idle.run(job, 0.0, fastest)
            latest = max(latest, job.arrival_s + finish - first)
    return Bounds(energy_j=energy, energy_deadlines_j=energy_deadlines, makespan_s=max(latest, _fluid(devices, jobs)),
                  idle_feasible=feasible)


def _energy(job: SimJob, devices: Sequence[Device], placed: list[Placed] | None) -> float:
    if placed is None:
        raise UserError(f"job {job.name}: the MILP found no assignment")
    return sum(items / devices[d].rate(job.workload).items_per_j for items, d, _ in placed)


def _fluid(devices: Sequence[Device], jobs: Sequence[SimJob]) -> float:
    """Least T such that every device, all slots busy from the first arrival, can share out all the items by T."""
    workloads = sorted({j.workload for j in jobs})
    items = {w: sum(j.items for j in jobs if j.workload == w) for w in workloads}
    pairs = [(d, w) for d, device in enumerate(devices) for w in workloads if device.runs(w)]
    size = len(pairs) + 1
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []
    for w in workloads:
        row = np.zeros(size)
        for p, (_, pw) in enumerate(pairs):
            row[p] = 1.0 if pw == w else 0.0
        rows.append(row)
        lo.append(items[w])
        hi.append(items[w])
    for d, device in enumerate(devices):
        row = np.zeros(size)
        for p, (pd, w) in enumerate(pairs):
            if pd == d:
                row[p] = 1.0 / (device.rate(w).items_per_s * device.profile.slots)
        row[-1] = -1.0
        rows.append(row)
        lo.append(-np.inf)
        hi.append(0.0)
    objective = np.zeros(size)
    objective[-1] = 1.0
    result = milp(objective, constraints=LinearConstraint(np.array(rows), lo, hi))
    return float(result.x[-1]) if result.status == 0 and result.x is not None else math.inf
