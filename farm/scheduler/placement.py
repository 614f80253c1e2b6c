"""Assignment: shards in submission order, each to the best-scoring candidate that still has a free slot.

Filters and scores depend on what a shard asks for (its backends and policy), not on the shard itself, so they
are worked out once per kind of shard; slots only fill during one call, so a candidate found full is passed over
for good. Placing S shards over C candidates costs O(C log C + S) per kind of shard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from farm.core.models import BackendOffer, Node
from farm.scheduler.filters import DEFAULT_FILTERS, Filter
from farm.scheduler.scoring import score
from farm.scheduler.types import Assignment, Placement, Rate, ShardRequest, Waiting


@dataclass
class _Ranking:
    """The candidates for one kind of shard, best first, and why the others were turned down."""

    eligible: list[tuple[float, str, Node, BackendOffer]]
    rejected: list[str]
    next: int = 0  # candidates before this one are full
    why_waiting: str = ""  # once every candidate is full, the same for every further shard


def place(
    shards: Sequence[ShardRequest],
    nodes: Sequence[Node],
    busy: Mapping[tuple[str, str], int] | None = None,
    rates: Mapping[tuple[str, str], Rate] | None = None,
    filters: Sequence[Filter] = DEFAULT_FILTERS,
    quotas: Mapping[tuple[str, str], int] | None = None,
) -> Placement:
    """Place what fits now. `busy` counts running shards per (node id, device); the rest wait for a slot.
    With `quotas` (a plan's shard counts per device), a device takes at most its quota and no device outside it."""
    used: Counter[tuple[str, str]] = Counter(busy or {})
    left: Counter[tuple[str, str]] | None = None if quotas is None else Counter(quotas)
    rankings: dict[tuple[object, ...], _Ranking] = {}
    assignments: list[Assignment] = []
    waiting: list[Waiting] = []
    for shard in shards:
        kind = (shard.backends, shard.policy, shard.model_bytes, tuple(shard.peak_bytes.items()))
        ranking = rankings.get(kind)
        if ranking is None:
            ranking = rankings[kind] = _rank(shard, nodes, rates or {}, filters, quotas)
        while ranking.next < len(ranking.eligible):
            value, basis, node, offer = ranking.eligible[ranking.next]
            key = (node.id, offer.device)
            if used[key] < offer.slots and (left is None or left[key] > 0):
                break
            ranking.next += 1
        if ranking.next == len(ranking.eligible):
            ranking.why_waiting = ranking.why_waiting or _why(ranking, used)
            waiting.append(Waiting(job_id=shard.job_id, index=shard.index, why=ranking.why_waiting))
            continue
        used[(node.id, offer.device)] += 1
        if left is not None:
            left[(node.id, offer.device)] -= 1
        assignments.append(
            Assignment(
                job_id=shard.job_id, index=shard.index, node_id=node.id, backend=offer.name,
                device=offer.device, threads=offer.threads, score=value, basis=basis,
            )
        )
    return Placement(assignments=tuple(assignments), waiting=tuple(waiting))


def _rank(shard: ShardRequest, nodes: Sequence[Node], rates: Mapping[tuple[str, str], Rate],
          filters: Sequence[Filter], quotas: Mapping[tuple[str, str], int] | None) -> _Ranking:
    eligible, rejected = [], []
    for node in nodes:
        for offer in node.backends:
            reason = next((r for f in filters if (r := f(node, offer, shard)) is not None), None)
            if reason is None and quotas is not None and not quotas.get((node.id, offer.device)):
                reason = "not in the plan"
            if reason is None:
                value, basis = score(node, offer, shard.policy, rates)
                eligible.append((value, basis, node, offer))
            else:
                rejected.append(f"{node.name}/{offer.device}: {reason}")
    eligible.sort(key=lambda candidate: -candidate[0])  # stable: equal scores keep the fleet's order
    return _Ranking(eligible, rejected)


def _why(ranking: _Ranking, used: Counter[tuple[str, str]]) -> str:
    full = [f"{node.name}/{offer.device}: busy ({used[(node.id, offer.device)]}/{offer.slots} slots)"
            if used[(node.id, offer.device)] >= offer.slots else f"{node.name}/{offer.device}: its planned share runs"
            for _, _, node, offer in ranking.eligible]
    reasons = full + ranking.rejected
    return "; ".join(reasons) if reasons else "no nodes in the fleet"
