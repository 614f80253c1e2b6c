"""Filters: each says why a (node, backend) candidate cannot run a kind of shard, or None when it can.

They depend only on the node, the offer and what the shard asks for (its allowed backends), never on how full the
node is: that changes shard by shard and is the assignment's business.
"""

from __future__ import annotations

from collections.abc import Callable

from farm.core.models import BackendOffer, Node, NodeState
from farm.scheduler.types import ShardRequest

Filter = Callable[[Node, BackendOffer, ShardRequest], str | None]


def node_ready(node: Node, offer: BackendOffer, shard: ShardRequest) -> str | None:
    return None if node.state is NodeState.READY else f"node is {node.state.value}"


def backend_allowed(node: Node, offer: BackendOffer, shard: ShardRequest) -> str | None:
    return None if offer.name in shard.backends else f"{offer.name.value} not allowed by the job"


def backend_available(node: Node, offer: BackendOffer, shard: ShardRequest) -> str | None:
    return None if offer.available else f"{offer.name.value} unavailable: {offer.reason or 'no reason given'}"


# Cheap, stable reasons first so that the explanation names the most fundamental one.
DEFAULT_FILTERS: tuple[Filter, ...] = (node_ready, backend_allowed, backend_available)
