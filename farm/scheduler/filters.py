"""Filters: each says why a (node, backend) candidate cannot run a kind of shard, or None when it can.

They depend only on the node, the offer and what the shard asks for (its allowed backends, the memory it needs),
never on how full the node is: that changes shard by shard and is the assignment's business.
"""

from __future__ import annotations

from collections.abc import Callable

from farm.core.backends import BACKENDS
from farm.core.models import BackendOffer, Node, NodeState
from farm.scheduler.types import ShardRequest

Filter = Callable[[Node, BackendOffer, ShardRequest], str | None]

GIB = 1024**3


def node_ready(node: Node, offer: BackendOffer, shard: ShardRequest) -> str | None:
    """Only a ready node takes new shards. A drained one (`farm drain`) is turned away on its flag, before the
    head's next refresh has made it draining: it keeps what it runs and is given nothing more."""
    if node.drain:
        return "node is draining: an operator drained it (`farm undrain` gives it work again)"
    if node.state is NodeState.DRAINING:
        return f"node is draining: owner busy: {node.busy}" if node.busy else "node is draining"
    return None if node.state is NodeState.READY else f"node is {node.state.value}"


def node_idle(node: Node, offer: BackendOffer, shard: ShardRequest) -> str | None:
    """A node whose owner needs it now (its agent's idle policy says why) takes no new shards."""
    return f"owner busy: {node.busy}" if node.busy else None


def backend_allowed(node: Node, offer: BackendOffer, shard: ShardRequest) -> str | None:
    return None if offer.name in shard.backends else f"{offer.name.value} not allowed by the job"


def backend_available(node: Node, offer: BackendOffer, shard: ShardRequest) -> str | None:
    return None if offer.available else f"{offer.name.value} unavailable: {offer.reason or 'no reason given'}"


def memory_fits(node: Node, offer: BackendOffer, shard: ShardRequest) -> str | None:
    """The shard's memory need (measured on this backend, else the model's own size) within the device's memory.

    Against the device's capacity, not its free memory: a device's free memory drops while it runs Farm's own
    shards (and PyTorch's caching allocator keeps what it took), so free memory would turn a device away from the
    very job it holds. Someone else filling the device is the owner's business: the idle policy's.
    """
    need = shard.memory_need(offer.name)
    capacity = device_memory(node, offer)
    if not need or not capacity or need <= capacity:
        return None
    return f"needs {need / GIB:.1f} GiB, {offer.device} has {capacity / GIB:.1f} GiB"


def device_memory(node: Node, offer: BackendOffer) -> int:
    """Bytes the offer's device can hold: its own memory for a GPU, the machine's (unified on a Mac) otherwise."""
    if BACKENDS[offer.name].own_memory:
        index = offer.device.partition(":")[2]
        return next((g.memory_bytes for g in node.hardware.gpus if str(g.index) == index), 0)
    return node.hardware.memory_bytes


# Cheap, stable reasons first so that the explanation names the most fundamental one.
DEFAULT_FILTERS: tuple[Filter, ...] = (node_ready, backend_allowed, backend_available, node_idle, memory_fits)
