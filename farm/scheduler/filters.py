"""Filters: each takes a (node, backend) candidate and a shard request and says why it cannot run it, or None."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from farm.core.models import BackendOffer, Node, NodeState
from farm.scheduler.types import ShardRequest

Filter = Callable[[Node, BackendOffer, ShardRequest, Mapping[tuple[str, str], int]], str | None]


def node_ready(node: Node, offer: BackendOffer, shard: ShardRequest, busy: Mapping[tuple[str, str], int]) -> str | None:
    return None if node.state is NodeState.READY else f"node is {node.state.value}"


def backend_allowed(
    node: Node, offer: BackendOffer, shard: ShardRequest, busy: Mapping[tuple[str, str], int]
) -> str | None:
    return None if offer.name in shard.backends else f"{offer.name.value} not allowed by the job"


def backend_available(
    node: Node, offer: BackendOffer, shard: ShardRequest, busy: Mapping[tuple[str, str], int]
) -> str | None:
    return None if offer.available else f"{offer.name.value} unavailable: {offer.reason or 'no reason given'}"


def free_slot(node: Node, offer: BackendOffer, shard: ShardRequest, busy: Mapping[tuple[str, str], int]) -> str | None:
    used = busy.get((node.id, offer.device), 0)
    return None if used < offer.slots else f"{offer.device} busy ({used}/{offer.slots} slots)"


# Cheap, stable reasons first so that the explanation names the most fundamental one.
DEFAULT_FILTERS: tuple[Filter, ...] = (node_ready, backend_allowed, backend_available, free_slot)
