"""Plans: how many of a job's remaining shards each device should run, by policy, from measured rates.

- efficiency: least energy. Shards go to the devices with the most items per joule; among devices within
  EQUALLY_EFFICIENT of the best, to whichever finishes them first (spreading costs no energy there). Devices
  without an energy figure are only used when no device has one.
- throughput: least makespan. Each shard goes where it would finish first (list scheduling).
- deadline: least energy that still finishes within the deadline: devices by items per joule, each filled up to
  what it can finish in time (for one kind of demand and linear costs this greedy fill is the exact optimum of the
  assignment problem). When even the whole fleet cannot make it, the plan says so and by how much.

Times are in seconds from now; a device's running work delays what it is given (`busy_s`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

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
    if policy is Policy.THROUGHPUT:
        return _evaluate(_list_schedule(shard_items, usable), shard_items, usable)
    by_efficiency = sorted(usable, key=lambda d: (-(d.items_per_j or 0.0), -d.items_per_s))
    if policy is Policy.EFFICIENCY or deadline_s is None:
        return _evaluate(_list_schedule(shard_items, _most_efficient(usable)), shard_items, usable)
    assignment = _fill(shard_items, by_efficiency, deadline_s)
    if len(assignment) < len(shard_items):
        fastest = _evaluate(_list_schedule(shard_items, usable), shard_items, usable)
        return fastest.model_copy(update={
            "feasible": False,
            "why": f"no plan meets deadline_s={deadline_s:g}: the fleet's fastest plan takes {fastest.makespan_s:.1f} s",
        })
    return _evaluate(assignment, shard_items, usable)


def _most_efficient(devices: Sequence[DeviceRate]) -> list[DeviceRate]:
    known = [d for d in devices if d.items_per_j is not None]
    if not known:
        return list(devices)
    best = max(d.items_per_j or 0.0 for d in known)
    return [d for d in known if (d.items_per_j or 0.0) >= best * (1 - EQUALLY_EFFICIENT)]


def _fill(shard_items: Sequence[int], ordered: Sequence[DeviceRate], deadline_s: float) -> list[DeviceRate]:
    """Shards, largest first, onto the devices in order, each device up to what its slots finish by the deadline."""
    assignment: list[DeviceRate] = []
    pending = sorted(shard_items, reverse=True)
    for device in ordered:
        finish = [device.busy_s] * device.slots
        while pending:
            seconds = pending[0] / device.items_per_s
            slot = min(range(device.slots), key=finish.__getitem__)
            if finish[slot] + seconds > deadline_s:
                break
            finish[slot] += seconds
            pending.pop(0)
            assignment.append(device)
        if not pending:
            break
    return assignment


def _list_schedule(shard_items: Sequence[int], devices: Sequence[DeviceRate]) -> list[DeviceRate]:
    """Largest shard first, each onto the slot where it would finish earliest."""
    slots = [(d.busy_s, i, s) for i, d in enumerate(devices) for s in range(d.slots)]
    heapq.heapify(slots)
    assignment = []
    for items in sorted(shard_items, reverse=True):
        # The earliest finish is not simply the earliest free slot when devices differ in speed.
        best = min(slots, key=lambda slot: slot[0] + items / devices[slot[1]].items_per_s)
        slots.remove(best)
        heapq.heapify(slots)
        finish = best[0] + items / devices[best[1]].items_per_s
        heapq.heappush(slots, (finish, best[1], best[2]))
        assignment.append(devices[best[1]])
    return assignment


def _evaluate(assignment: Sequence[DeviceRate], shard_items: Sequence[int], devices: Sequence[DeviceRate]) -> Plan:
    """Quotas, makespan and energy of an assignment of the shards (largest first) to devices."""
    quotas = {d.key: 0 for d in devices}
    finish: dict[tuple[str, str], list[float]] = {d.key: [d.busy_s] * d.slots for d in devices}
    energy: float | None = 0.0
    for items, device in zip(sorted(shard_items, reverse=True), assignment, strict=True):
        quotas[device.key] += 1
        slots = finish[device.key]
        slot = min(range(len(slots)), key=slots.__getitem__)
        slots[slot] += items / device.items_per_s
        energy = None if energy is None or device.items_per_j is None else energy + items / device.items_per_j
    makespan = max((max(f) for key, f in finish.items() if quotas[key]), default=0.0)
    return Plan(quotas={k: v for k, v in quotas.items() if v}, makespan_s=makespan, energy_j=energy)
