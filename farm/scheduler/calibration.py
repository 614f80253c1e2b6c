"""Calibration: what each (node, device) has been measured to do on a model, from its finished shards.

Every finished shard is a measurement, so the figures refine themselves as a fleet works. Energy per item is only
given where every sample carries energy from one source: a rate mixing a counter with an estimate would rank
unlike against like.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from farm.core.frozen import Frozen
from farm.scheduler.types import Rate


class Sample(Frozen):
    node_id: str
    device: str
    items: int
    seconds: float
    energy_j: float = 0.0
    energy_source: str = ""  # empty: not measured


def rates(samples: Iterable[Sample]) -> dict[tuple[str, str], Rate]:
    grouped: defaultdict[tuple[str, str], list[Sample]] = defaultdict(list)
    for sample in samples:
        grouped[(sample.node_id, sample.device)].append(sample)
    found = {}
    for key, group in grouped.items():
        items = sum(s.items for s in group)
        seconds = sum(s.seconds for s in group)
        if items <= 0 or seconds <= 0:
            continue
        sources = {s.energy_source for s in group}
        joules = sum(s.energy_j for s in group)
        measured = len(sources) == 1 and "" not in sources and joules > 0
        found[key] = Rate(
            items_per_s=items / seconds,
            items_per_j=items / joules if measured else None,
            energy_source=sources.pop() if measured else "",
            samples=len(group),
        )
    return found
