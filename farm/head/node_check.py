"""Which nodes hold work: node state from heartbeats and from the nodes' work streams, each scheduling round.

A node is ready while it beats and its work stream (farm.head.links) is open: that stream is how its shards reach it,
and how it says they ended. A trusted node's Ray worker (training's) is Ray's own business: Ray fails an actor whose
node dies."""

from __future__ import annotations

import logging
import time

from farm.core.models import NodeState
from farm.head.liveness import derive_state
from farm.head.settings import HeadSettings
from farm.head.store import Store

log = logging.getLogger("farm.head")


class NodeWatch:
    def __init__(self, store: Store, settings: HeadSettings) -> None:
        self.store = store
        self.settings = settings

    async def refresh(self, connected: set[str]) -> tuple[set[str], set[str]]:
        """Each node's state brought up to date (`connected`: the nodes whose work stream is open); returns the nodes
        that hold their running shards (ready or draining) and those draining (their owner or an operator took them
        out of the farm's hands)."""
        now = time.time()
        holding, draining = set(), set()
        for node in self.store.node_liveness():  # not store.nodes(): thousands of nodes, every second
            if node.state is NodeState.OFFLINE:  # it left or went silent; a heartbeat or Register brings it back
                continue
            if node.draining:
                draining.add(node.id)
            state = derive_state(node, node.id in connected, now - node.last_heartbeat, self.settings.offline_after_s)
            if state is not node.state:
                log.info("node %s is %s", node.name, state.value)
                self.store.set_node_state(node.id, state)
            if state in (NodeState.READY, NodeState.DRAINING):
                holding.add(node.id)
        return holding, draining
