"""Assignment: shards in submission order, each to the best-scoring candidate with a free slot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from farm.core.models import Node
from farm.scheduler.filters import DEFAULT_FILTERS, Filter
from farm.scheduler.scoring import score
from farm.scheduler.types import Assignment, Placement, Rate, ShardRequest, Waiting


def place(
    shards: Sequence[ShardRequest],
    nodes: Sequence[Node],
    busy: Mapping[tuple[str, str], int] | None = None,
    rates: Mapping[tuple[str, str], Rate] | None = None,
    filters: Sequence[Filter] = DEFAULT_FILTERS,
) -> Placement:
    """Place what fits now. `busy` counts running shards per (node id, device); the rest wait for a slot."""
    used: Counter[tuple[str, str]] = Counter(busy or {})
    rates = rates or {}
    candidates = [(node, offer) for node in nodes for offer in node.backends]
    assignments: list[Assignment] = []
    waiting: list[Waiting] = []
    for shard in shards:
        best: tuple[float, Node, int] | None = None
        turned_down: list[str] = []
        for position, (node, offer) in enumerate(candidates):
            reason = next((r for f in filters if (r := f(node, offer, shard, used)) is not None), None)
            if reason is not None:
                turned_down.append(f"{node.name}/{offer.device}: {reason}")
                continue
            value = score(node, offer, shard.policy, rates)
            if best is None or value > best[0]:
                best = (value, node, position)
        if best is None:
            why = "; ".join(turned_down) if turned_down else "no nodes in the fleet"
            waiting.append(Waiting(job_id=shard.job_id, index=shard.index, why=why))
            continue
        value, node, position = best
        offer = candidates[position][1]
        used[(node.id, offer.device)] += 1
        assignments.append(
            Assignment(
                job_id=shard.job_id, index=shard.index, node_id=node.id, backend=offer.name,
                device=offer.device, threads=offer.threads, score=value,
            )
        )
    return Placement(assignments=tuple(assignments), waiting=tuple(waiting))
