"""Plans: how many of a job's remaining shards each device should run, by policy, from measured rates.

- efficiency: least energy. Shards go to the devices with the most items per joule; among devices as efficient
  as the best within what their figures can tell apart, to whichever finishes them first (spreading costs no
  energy there). Figures from one kind of meter are told apart down to EQUALLY_EFFICIENT; figures from unlike
  meters (a counter against a model estimate) only beyond both meters' uncertainty, so that an estimate never
  wins or loses on its own error. Devices without an energy figure are only used when no device has one.
- throughput: least makespan. Each shard goes where it would finish first (list scheduling).
- deadline: least energy that still finishes within the deadline: devices by items per joule, each filled up to
  what it can finish in time (for one kind of demand and linear costs this greedy fill is the exact optimum of the
  assignment problem). When even the whole fleet cannot make it, the plan says so and by how much.

Times are in seconds from now; a device's running work delays what it is given (`busy_s`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from farm.core.energy import UNCERTAINTY
from farm.core.frozen import Frozen
from farm.core.spec import Policy

# Devices whose items per joule lie within this fraction of the best count as equally efficient: measurements of
# one model on twin devices differ by more than that only when the devices really differ.
EQUALLY_EFFICIENT = 0.05


class DeviceRate(Frozen):
    node_id: str
    device: str
    slots: int = 1
    items_per_s: float  # per slot
    items_per_j: float | None = None  # None: energy unknown, ranked after every device that has a figure
    energy_source: str = ""  # the meter behind items_per_j (an EnergySource value)
    busy_s: float = 0.0  # until its running shards finish

    @property
    def key(self) -> tuple[str, str]:
        return (self.node_id, self.device)


class Plan(Frozen):
    quotas: dict[tuple[str, str], int]
    makespan_s: float
    energy_j: float | None  # None when some planned device has no energy figure
    feasible: bool = True
    why: str = ""


def plan(shard_items: Sequence[int], devices: Sequence[DeviceRate], policy: Policy,
         deadline_s: float | None = None) -> Plan:
    usable = [d for d in devices if d.items_per_s > 0 and d.slots > 0]
    if not shard_items:
        return Plan(quotas={}, makespan_s=0.0, energy_j=0.0)
    if not usable:
        return Plan(quotas={}, makespan_s=math.inf, energy_j=None, feasible=False, why="no measured device")
    return POLICIES[policy].plan(shard_items, usable, deadline_s)


def fastest(shard_items: Sequence[int], usable: Sequence[DeviceRate], deadline_s: float | None) -> Plan:
    """throughput: each shard where it would finish first."""
    return _evaluate(_list_schedule(shard_items, usable), usable)


def most_efficient(shard_items: Sequence[int], usable: Sequence[DeviceRate], deadline_s: float | None) -> Plan:
    """efficiency: on the most efficient devices, spread among those that cannot be told apart."""
    return _evaluate(_list_schedule(shard_items, _most_efficient(usable)), usable)


def within_deadline(shard_items: Sequence[int], usable: Sequence[DeviceRate], deadline_s: float | None) -> Plan:
    """deadline: devices by efficiency, each filled up to what it finishes in time."""
    if deadline_s is None:
        return most_efficient(shard_items, usable, deadline_s)
    by_efficiency = sorted(usable, key=lambda d: (-(d.items_per_j or 0.0), -d.items_per_s))
    assignment = _fill(shard_items, by_efficiency, deadline_s)
    if len(assignment) < len(shard_items):
        quickest = fastest(shard_items, usable, deadline_s)
        return quickest.model_copy(update={
            "feasible": False,
            "why": f"no plan meets deadline_s={deadline_s:g}: the fleet's fastest plan takes "
                   f"{quickest.makespan_s:.1f} s",
        })
    return _evaluate(assignment, usable)


@dataclass(frozen=True)
class PolicyRule:
    """What a scheduling policy does: how it plans a round, and what a measured device scores (items per joule
    where it has the figure, else items per second)."""

    plan: Callable[[Sequence[int], Sequence[DeviceRate], float | None], Plan]
    scores_energy: bool


# Adding a policy: its Policy member (farm.core.spec) and its line here.
POLICIES: Mapping[Policy, PolicyRule] = {
    Policy.EFFICIENCY: PolicyRule(most_efficient, scores_energy=True),
    Policy.THROUGHPUT: PolicyRule(fastest, scores_energy=False),
    Policy.DEADLINE: PolicyRule(within_deadline, scores_energy=False),
}


def _most_efficient(devices: Sequence[DeviceRate]) -> list[DeviceRate]:
    known = [d for d in devices if d.items_per_j is not None]
    if not known:
        return list(devices)
    best = max(known, key=lambda d: d.items_per_j or 0.0)
    return [d for d in known if (d.items_per_j or 0.0) >= (best.items_per_j or 0.0) * (1 - distinguishable(d, best))]


def distinguishable(a: DeviceRate, b: DeviceRate) -> float:
    """The smallest relative difference in items per joule that says one of two devices is more efficient."""
    if a.energy_source == b.energy_source:
        return EQUALLY_EFFICIENT  # one meter's bias is shared by both figures
    uncertainty = UNCERTAINTY.get(a.energy_source, 1.0) + UNCERTAINTY.get(b.energy_source, 1.0)
    return min(max(EQUALLY_EFFICIENT, uncertainty), 0.9)


def _fill(shard_items: Sequence[int], ordered: Sequence[DeviceRate], deadline_s: float
          ) -> list[tuple[int, DeviceRate]]:
    """Shards, largest first, onto the devices in order, each device taking every remaining shard that its slots
    still finish by the deadline (a smaller shard may fit where a larger one did not)."""
    assignment: list[tuple[int, DeviceRate]] = []
    pending = sorted(shard_items, reverse=True)
    for device in ordered:
        free = [device.busy_s] * device.slots  # a min-heap of slot free times
        left = []
        for items in pending:
            finish = free[0] + items / device.items_per_s
            if finish <= deadline_s:
                heapq.heapreplace(free, finish)
                assignment.append((items, device))
            else:
                left.append(items)
        pending = left
        if not pending:
            break
    return assignment


def _list_schedule(shard_items: Sequence[int], devices: Sequence[DeviceRate]) -> list[tuple[int, DeviceRate]]:
    """Largest shard first, each onto the device where it would finish earliest (on its earliest-free slot).

    Shards of one size share one heap keyed by their finish time on each device, so this is O(S log D); a job's
    shards come in at most two sizes.
    """
    free = [[d.busy_s] * d.slots for d in devices]  # per device, a min-heap of its slots' free times
    assignment: list[tuple[int, DeviceRate]] = []
    sizes = sorted(shard_items, reverse=True)
    start = 0
    while start < len(sizes):
        size = sizes[start]
        end = start
        while end < len(sizes) and sizes[end] == size:
            end += 1
        finishes = [(free[k][0] + size / d.items_per_s, k) for k, d in enumerate(devices)]
        heapq.heapify(finishes)
        for _ in range(end - start):
            finish, k = heapq.heappop(finishes)
            heapq.heapreplace(free[k], finish)
            assignment.append((size, devices[k]))
            heapq.heappush(finishes, (free[k][0] + size / devices[k].items_per_s, k))
        start = end
    return assignment


def _evaluate(assignment: Sequence[tuple[int, DeviceRate]], devices: Sequence[DeviceRate]) -> Plan:
    """Quotas, makespan and energy of an assignment of shards (their items) to devices, in the order taken."""
    quotas = {d.key: 0 for d in devices}
    finish: dict[tuple[str, str], list[float]] = {d.key: [d.busy_s] * d.slots for d in devices}  # min-heaps
    energy: float | None = 0.0
    for items, device in assignment:
        quotas[device.key] += 1
        slots = finish[device.key]
        heapq.heapreplace(slots, slots[0] + items / device.items_per_s)
        energy = None if energy is None or device.items_per_j is None else energy + items / device.items_per_j
    makespan = max((max(f) for key, f in finish.items() if quotas[key]), default=0.0)
    return Plan(quotas={k: v for k, v in quotas.items() if v}, makespan_s=makespan, energy_j=energy)
