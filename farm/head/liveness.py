"""Node liveness in memory: every node's latest heartbeat, kept between the store's batched writes.

A heartbeat changes no state, only figures (when the node was last heard, its load, its power), and thousands of
nodes beat every second or two: writing each beat to SQLite on the event loop would cost a transaction per beat.
So a beat lands here, the offline check reads it from here, and the store writes the unsaved ones in one transaction
every `HeadSettings.heartbeat_save_s` (and before anyone reads the node table). Node states stay in the store, which
remains the source of truth for every transition.
"""

from __future__ import annotations

from dataclasses import dataclass

from farm.core.energy import DevicePower
from farm.core.models import GpuMemory, NodeState


@dataclass(frozen=True, slots=True)
class Beat:
    """A node's latest heartbeat."""

    at: float  # time.time() when the head received it
    cpu_percent: float
    memory_percent: float
    power: tuple[DevicePower, ...]
    busy: str
    farm_cpu_percent: float = 0.0  # Farm's own share of cpu_percent
    gpu_memory: tuple[GpuMemory, ...] = ()


class Liveness:
    def __init__(self) -> None:
        self._latest: dict[str, Beat] = {}
        self._unsaved: set[str] = set()

    def record(self, node_id: str, beat: Beat) -> None:
        self._latest[node_id] = beat
        self._unsaved.add(node_id)

    def latest(self, node_id: str) -> Beat | None:
        """The node's latest beat since the head started; None if none since then."""
        return self._latest.get(node_id)

    def last_beat(self, node_id: str) -> float | None:
        """When the head last heard from the node, since it started; None if not since then."""
        beat = self._latest.get(node_id)
        return None if beat is None else beat.at

    def take_unsaved(self) -> list[tuple[str, Beat]]:
        """The beats received since the last call, one (the latest) per node."""
        taken = [(node_id, self._latest[node_id]) for node_id in self._unsaved]
        self._unsaved.clear()
        return taken

    def __len__(self) -> int:
        return len(self._latest)


@dataclass(frozen=True, slots=True)
class NodeLiveness:
    """What the offline check reads of a node: its state, when it was last heard from, and whether it takes work
    (its owner's busy reason, an operator's drain)."""

    id: str
    name: str
    state: NodeState
    ray_node_id: str
    last_heartbeat: float
    busy: str = ""
    drain: bool = False

    @property
    def draining(self) -> bool:
        """Its owner or an operator wants it to take no new shards: it keeps what it runs."""
        return self.drain or bool(self.busy)


def derive_state(node: NodeLiveness, working: bool, silent_s: float, offline_after_s: float) -> NodeState:
    """A live node's state now: offline once silent too long; else by its work stream (not open: joining) and
    whether it takes work (draining: no new shards, but it keeps running what it has)."""
    if silent_s > offline_after_s:
        return NodeState.OFFLINE
    if not working:
        return NodeState.JOINING
    return NodeState.DRAINING if node.draining else NodeState.READY
