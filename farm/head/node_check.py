"""Which nodes hold work: node state from heartbeats and from Ray's own view of its nodes, each scheduling round.

A node must also be backed by its Ray worker. The scheduler places a shard by the node's claimed offers, and Ray runs
it only where the node's Ray worker offers the matching resource (`farm.<backend>`, one per slot): a node claiming a
device its Ray worker does not offer (a `cuda:0` it does not have) would hold a shard that Ray can never schedule,
"running" for ever. Such a node is never made ready."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping

import ray

from farm.core.models import BackendOffer, NodeState
from farm.head import remote
from farm.head.liveness import derive_state
from farm.head.settings import HeadSettings
from farm.head.store import Store

log = logging.getLogger("farm.head")


def unbacked(offers: Iterable[BackendOffer], ray_resources: Mapping[str, float]) -> list[str]:
    """The backends whose claimed slots the Ray worker does not offer, as `name (N claimed, Ray offers M)`."""
    claimed: dict[str, int] = {}
    for offer in offers:
        if offer.available and offer.slots:
            claimed[offer.name.value] = claimed.get(offer.name.value, 0) + offer.slots
    return [f"{name} ({slots} claimed, Ray offers {ray_resources.get(f'farm.{name}', 0):g})"
            for name, slots in sorted(claimed.items()) if ray_resources.get(f"farm.{name}", 0) < slots]


class NodeWatch:
    def __init__(self, store: Store, settings: HeadSettings) -> None:
        self.store = store
        self.settings = settings
        self.unbacked: set[str] = set()  # nodes claiming devices their Ray worker does not offer (told once)

    async def refresh(self) -> tuple[set[str], set[str]]:
        """Each node's state brought up to date; returns the nodes that hold their running shards (their Ray worker
        runs: ready or draining) and those draining (their owner or an operator took them out of the farm's
        hands)."""
        ray_nodes = await asyncio.to_thread(ray.nodes)
        label = remote.NODE_LABEL
        live = [n for n in ray_nodes if n.get("Alive") and label in n.get("Labels", {})]
        alive = {n["Labels"][label]: n["NodeID"] for n in live}
        resources = {n["Labels"][label]: n.get("Resources", {}) for n in live}
        now = time.time()
        holding, draining = set(), set()
        for node in self.store.node_liveness():  # not store.nodes(): thousands of nodes, every second
            if node.state is NodeState.OFFLINE:  # it left or went silent; a heartbeat or Register brings it back
                continue
            if node.draining:
                draining.add(node.id)
            state = derive_state(node, node.id in alive, now - node.last_heartbeat, self.settings.offline_after_s)
            if state is NodeState.READY and node.state is not NodeState.READY and self._claims_unbacked(
                    node.id, resources[node.id]):
                state = NodeState.JOINING  # never ready: its shards would wait for ever on Ray
            ray_id = alive[node.id] if state in (NodeState.READY, NodeState.DRAINING) else None
            if state is not node.state or (ray_id and ray_id != node.ray_node_id):
                log.info("node %s is %s", node.name, state.value)
                self.store.set_node_state(node.id, state, ray_id)
            if state in (NodeState.READY, NodeState.DRAINING):
                holding.add(node.id)
        return holding, draining

    def _claims_unbacked(self, node_id: str, ray_resources: dict[str, float]) -> bool:
        (node,) = self.store.nodes(node_id)
        missing = unbacked(node.backends, ray_resources)
        if missing and node_id not in self.unbacked:
            log.warning("node %s claims what its Ray worker does not offer: %s; it gets no shards", node.name,
                        ", ".join(missing))
        if missing:
            self.unbacked.add(node_id)
        else:
            self.unbacked.discard(node_id)
        return bool(missing)
