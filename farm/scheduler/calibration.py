"""Calibration: what each (node, device) has been measured to do on a model, from its finished shards.

Every finished shard is a measurement, so the figures refine themselves as a fleet works. Only the latest RECENT
shards of a device count: a device whose speed changed (a driver update, a measurement taken under someone else's
load) converges to what it does now. Energy per item is only given where every sample carries energy from one
source: a rate mixing a counter with an estimate would rank unlike against like.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from farm.core.energy import METER_STEPS, EnergyBasis
from farm.core.frozen import Frozen
from farm.scheduler.types import Rate

# Shards per device behind a rate: enough to average out one slow shard, few enough to follow a change.
RECENT = 8


class Sample(Frozen):
    node_id: str
    device: str
    items: int
    seconds: float
    energy_j: float = 0.0
    energy_source: str = ""  # empty: not measured
    marginal_j: float | None = None  # above the device's idle draw; None where no idle draw was read on its meter
    finished_at: float = 0.0  # unix seconds


def rates(samples: Iterable[Sample], meter_steps: Mapping[tuple[str, str], float] | None = None,
          basis: EnergyBasis = EnergyBasis.MARGINAL) -> dict[tuple[str, str], Rate]:
    """Per (node, device): its speed over its latest shards, and its items per joule over those of them that lasted
    METER_STEPS of the device's meter (`meter_steps`: seconds per step), where any did: the short first shards of an
    auto-sized job measure speed well and energy badly (a meter's step is billed whole).

    `basis` marginal: items per joule above the idle draw, where every such shard has that figure; a device without
    one ranks by its total, an upper bound of its marginal energy (so it is never favoured for lacking a reading)."""
    grouped: defaultdict[tuple[str, str], list[Sample]] = defaultdict(list)
    for sample in samples:
        grouped[(sample.node_id, sample.device)].append(sample)
    found = {}
    for key, group in grouped.items():
        group = sorted(group, key=lambda s: s.finished_at)[-RECENT:]
        items = sum(s.items for s in group)
        seconds = sum(s.seconds for s in group)
        if items <= 0 or seconds <= 0:
            continue
        floor_s = METER_STEPS * (meter_steps or {}).get(key, 0.0)
        metered = [s for s in group if s.seconds >= floor_s] or group
        sources = {s.energy_source for s in metered}
        marginal = basis is EnergyBasis.MARGINAL and all(s.marginal_j is not None for s in metered)
        joules = sum((s.marginal_j or 0.0) if marginal else s.energy_j for s in metered)
        measured = len(sources) == 1 and "" not in sources and joules > 0
        found[key] = Rate(
            items_per_s=items / seconds,
            items_per_j=sum(s.items for s in metered) / joules if measured else None,
            energy_source=sources.pop() if measured else "",
            samples=len(group),
            measured_at=max(s.finished_at for s in group),
            max_items=max(s.items for s in group),
            energy_basis=(EnergyBasis.MARGINAL if marginal else EnergyBasis.TOTAL).value if measured else "",
        )
    return found
