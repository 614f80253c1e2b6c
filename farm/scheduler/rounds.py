"""One scheduling round for one job: measure what is unmeasured, plan the rest by policy, fill free slots.

Devices that have never run the job's model get one shard each: their first shard is their calibration, done on
real work. While any calibration of this job is still running, the other shards wait for its figures (planning
without them would hand the job to whichever device happened to finish first). Then the remaining shards are
planned over the measured devices (`plan.plan`), whose quotas bound the assignment (`placement.place`). Rounds run
whenever something changes, so a device that frees up or joins is planned in, and one that leaves is planned out.

Exploration: a device measured long ago (RECALIBRATE_AFTER_S) still plans by its old figure, and gets one shard
besides, which measures it again. Without that, a device measured once under someone else's load, or before an
upgrade, would keep a bad figure forever: the efficiency policy would never give it the work that corrects it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from farm.core.frozen import Frozen
from farm.core.models import Node
from farm.scheduler.filters import DEFAULT_FILTERS
from farm.scheduler.placement import place
from farm.scheduler.plan import DeviceRate, plan
from farm.scheduler.types import Assignment, Rate, ShardRequest, Waiting

# A measurement older than this is re-taken by one shard of the next job that could use the device.
RECALIBRATE_AFTER_S = 6 * 3600.0


class Round(Frozen):
    assignments: tuple[Assignment, ...]
    waiting: tuple[Waiting, ...]
    explanation: tuple[str, ...]  # the plan and each candidate's figures, for `farm job ID --explain`
    infeasible: str = ""  # set when every device is measured and still no plan meets the deadline


def schedule_round(
    shards: Sequence[ShardRequest],
    nodes: Sequence[Node],
    busy: Mapping[tuple[str, str], int],
    running_items: Mapping[tuple[str, str], int],
    rates: Mapping[tuple[str, str], Rate],
    deadline_s: float | None = None,
    now: float = 0.0,
    recalibrate_after_s: float = RECALIBRATE_AFTER_S,
) -> Round:
    """`busy`: running shards per device (all jobs); `running_items`: this job's items running per device;
    `now`: the time that rates' `measured_at` are compared with (0: never re-measure)."""
    if not shards:
        return Round(assignments=(), waiting=(), explanation=())
    policy = shards[0].policy
    candidates = [
        (node, offer) for node in nodes for offer in node.backends
        if all(f(node, offer, shards[0]) is None for f in DEFAULT_FILTERS)
    ]
    quotas: dict[tuple[str, str], int] = {}  # shards that measure a device: never measured, or long ago
    unmeasured: list[tuple[str, str]] = []
    measured: list[DeviceRate] = []
    lines: list[str] = []
    for node, offer in candidates:
        key = (node.id, offer.device)
        rate = rates.get(key)
        if rate is None:
            quotas[key] = 0 if running_items.get(key) else 1  # one shard measures it
            unmeasured.append(key)
            lines.append(f"{node.name}/{offer.device}: not measured yet; its next shard calibrates it")
            continue
        busy_s = running_items.get(key, 0) / rate.items_per_s / max(offer.slots, 1)
        measured.append(DeviceRate(node_id=node.id, device=offer.device, slots=offer.slots,
                                   items_per_s=rate.items_per_s, items_per_j=rate.items_per_j,
                                   energy_source=rate.energy_source, busy_s=busy_s))
        per_j = f", {rate.items_per_j:,.1f} items/J ({rate.energy_source})" if rate.items_per_j else ""
        line = f"{node.name}/{offer.device}: {rate.items_per_s:,.0f} items/s{per_j} over {rate.samples} shards"
        age = now - rate.measured_at
        if now and age > recalibrate_after_s and not running_items.get(key):
            quotas[key] = 1
            line += f", measured {age / 3600:.0f} h ago; one shard measures it again"
        lines.append(line)
    calibrating = sum(quotas.values())
    remaining = [s.items for s in shards][calibrating:]
    awaited = [key for key in unmeasured if running_items.get(key)]
    if awaited:
        names = {node.id: node.name for node in nodes}
        lines.insert(0, "waiting for calibration on " + ", ".join(f"{names[k[0]]}/{k[1]}" for k in awaited))
        remaining = []
    result = plan(remaining, measured, policy, deadline_s)
    for key, count in result.quotas.items():
        quotas[key] = quotas.get(key, 0) + count
    names = {node.id: node.name for node in nodes}
    if result.quotas:
        shares = ", ".join(f"{names[k[0]]}/{k[1]} {n}" for k, n in sorted(result.quotas.items()))
        energy = f", {result.energy_j:,.1f} J" if result.energy_j is not None else ""
        lines.insert(0, f"plan ({policy.value}) for {len(remaining)} shards: {shares}; "
                        f"about {result.makespan_s:.2f} s{energy}")
    infeasible = result.why if not result.feasible and not calibrating and measured else ""
    placement = place(shards, nodes, busy, rates, quotas=quotas)
    return Round(assignments=placement.assignments, waiting=placement.waiting, explanation=tuple(lines),
                 infeasible=infeasible)
