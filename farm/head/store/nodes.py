"""Nodes: what each registered, its state, its drain flag and its latest heartbeat (in memory between saves)."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence

from farm.core.energy import DevicePower
from farm.core.errors import NotFoundError
from farm.core.models import BackendOffer, GpuMemory, Hardware, Node, NodeState
from farm.head.liveness import Beat, Liveness, NodeLiveness
from farm.head.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    hardware TEXT NOT NULL,
    backends TEXT NOT NULL,
    address TEXT NOT NULL DEFAULT '',
    ray_node_id TEXT NOT NULL DEFAULT '',
    token_hash TEXT NOT NULL,
    registered_at REAL NOT NULL,
    last_heartbeat REAL NOT NULL DEFAULT 0,
    cpu_percent REAL NOT NULL DEFAULT 0,
    memory_percent REAL NOT NULL DEFAULT 0,
    power TEXT NOT NULL DEFAULT '[]',
    busy TEXT NOT NULL DEFAULT '',
    drain INTEGER NOT NULL DEFAULT 0
);
"""


@functools.lru_cache(maxsize=65536)
def _hardware(text: str) -> Hardware:
    return Hardware.model_validate_json(text)


@functools.lru_cache(maxsize=65536)
def _backends(text: str) -> tuple[BackendOffer, ...]:
    return tuple(BackendOffer.model_validate(b) for b in json.loads(text))


class NodeRecords(Database):
    def _create(self) -> None:
        super()._create()
        self.liveness = Liveness()  # the latest heartbeats, between two save_heartbeats
        self._node_states: dict[str, NodeState] = {}  # node_state's cache; every write of a state drops its entry
        self._db.executescript(SCHEMA)
        self._add_column("nodes", "drain", "INTEGER NOT NULL DEFAULT 0")
        self._add_column("nodes", "farm_cpu_percent", "REAL NOT NULL DEFAULT 0")
        self._add_column("nodes", "gpu_memory", "TEXT NOT NULL DEFAULT '[]'")
        self._add_column("nodes", "trusted", "INTEGER NOT NULL DEFAULT 0")

    def upsert_node(
        self, node_id: str, name: str, hardware: Hardware, backends: list[BackendOffer], address: str, token_hash: str,
        trusted: bool = False,
    ) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute(
                """INSERT INTO nodes (id, name, state, hardware, backends, address, token_hash, registered_at,
                                      last_heartbeat, trusted)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT(id) DO UPDATE SET name=excluded.name, state=excluded.state,
                     hardware=excluded.hardware, backends=excluded.backends, address=excluded.address,
                     token_hash=excluded.token_hash, ray_node_id='', last_heartbeat=excluded.last_heartbeat,
                     trusted=excluded.trusted""",
                (
                    node_id, name, NodeState.JOINING.value, hardware.model_dump_json(),
                    json.dumps([b.model_dump(mode="json") for b in backends]), address, token_hash, now, now,
                    int(trusted),
                ),
            )
        self._node_states.pop(node_id, None)  # back to joining

    def node_trusted(self, node_id: str) -> bool:
        """Whether the node is the operator's own (joined with the API token): it may join the head's Ray."""
        row = self._db.execute("SELECT trusted FROM nodes WHERE id=?", (node_id,)).fetchone()
        return bool(row and row["trusted"])

    def node_token_hash(self, node_id: str) -> str | None:
        row = self._db.execute("SELECT token_hash FROM nodes WHERE id=?", (node_id,)).fetchone()
        return None if row is None else str(row["token_hash"])

    def forget_node_identity(self, id_or_name: str) -> str:
        """An operator's word that the machine of this node lost its identity: its token no longer counts, and the
        next Register with its id needs no proof (farm.head.auth.Tokens.check_returning_node). The node's id."""
        node_id = self.node_id(id_or_name)
        self._db.execute("UPDATE nodes SET token_hash='' WHERE id=?", (node_id,))
        return node_id

    def heartbeat(self, node_id: str, cpu_percent: float, memory_percent: float, power: tuple[DevicePower, ...],
                  busy: str = "", farm_cpu_percent: float = 0.0, gpu_memory: tuple[GpuMemory, ...] = ()) -> None:
        """Kept in memory (self.liveness) until the next save_heartbeats: no SQL per beat."""
        self.liveness.record(node_id, Beat(time.time(), cpu_percent, memory_percent, power, busy, farm_cpu_percent,
                                           gpu_memory))

    def save_heartbeats(self, beats: Sequence[tuple[str, Beat]] | None = None) -> int:
        """Write heartbeats (by default all received since the last save, the latest per node) in one transaction;
        how many. A beat older than what a node's row already has (a later save, a Register) changes nothing."""
        beats = self.liveness.take_unsaved() if beats is None else beats
        if beats:
            with self._tx() as db:
                db.executemany(
                    """UPDATE nodes SET last_heartbeat=?, cpu_percent=?, memory_percent=?, power=?, busy=?,
                                        farm_cpu_percent=?, gpu_memory=?
                       WHERE id=? AND last_heartbeat <= ?""",
                    [(b.at, b.cpu_percent, b.memory_percent, "[" + ",".join(p.model_dump_json() for p in b.power) + "]",
                      b.busy, b.farm_cpu_percent, "[" + ",".join(m.model_dump_json() for m in b.gpu_memory) + "]",
                      node_id, b.at) for node_id, b in beats],
                )
        return len(beats)

    def node_liveness(self) -> list[NodeLiveness]:
        """Every node not offline: its state, when it was last heard from and its owner's busy reason (in memory or
        saved, whichever is later), and its drain flag. What the offline check needs, without reading (and parsing)
        the whole node table."""
        rows = self._db.execute(
            "SELECT id, name, state, ray_node_id, last_heartbeat, busy, drain FROM nodes WHERE state != ?",
            (NodeState.OFFLINE.value,),
        ).fetchall()
        latest = self.liveness.latest
        found = []
        for r in rows:
            beat = latest(r[0])
            last_heartbeat, busy = (r[4], r[5]) if beat is None or beat.at < r[4] else (beat.at, beat.busy)
            found.append(NodeLiveness(id=r[0], name=r[1], state=NodeState(r[2]), ray_node_id=r[3],
                                      last_heartbeat=last_heartbeat, busy=busy, drain=bool(r[6])))
        return found

    def node_id(self, id_or_name: str) -> str:
        """The id of the node with this id, else of the one with this name (the latest registered, should two
        share a name); NotFoundError if none."""
        row = self._db.execute(
            "SELECT id FROM nodes WHERE id=? OR name=? ORDER BY id=? DESC, registered_at DESC LIMIT 1",
            (id_or_name, id_or_name, id_or_name),
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no node {id_or_name!r}")
        return str(row["id"])

    def set_node_drain(self, id_or_name: str, drain: bool) -> Node:
        """An operator's drain of the node with this id or name; the node as it is now. Kept across head restarts
        and the agent's Register (upsert_node leaves it). The scheduler reads it from `nodes()` at once; the
        dispatcher's next refresh derives the node's state (draining) from it."""
        node_id = self.node_id(id_or_name)
        self._db.execute("UPDATE nodes SET drain=? WHERE id=?", (int(drain), node_id))
        return self.nodes(node_id)[0]

    def node_state(self, node_id: str) -> NodeState:
        """Read once, then from memory until the state changes (every heartbeat asks)."""
        state = self._node_states.get(node_id)
        if state is None:
            row = self._db.execute("SELECT state FROM nodes WHERE id=?", (node_id,)).fetchone()
            if row is None:
                return NodeState.OFFLINE
            state = self._node_states[node_id] = NodeState(row["state"])
        return state

    def set_node_state(self, node_id: str, state: NodeState, ray_node_id: str | None = None) -> None:
        if ray_node_id is None:
            self._db.execute("UPDATE nodes SET state=? WHERE id=?", (state.value, node_id))
        else:
            self._db.execute(
                "UPDATE nodes SET state=?, ray_node_id=? WHERE id=?", (state.value, ray_node_id, node_id)
            )
        self._node_states.pop(node_id, None)

    def nodes(self, node_id: str | None = None) -> list[Node]:
        """Every node (or the one with this id), with its latest heartbeat's figures: from memory where they are at
        least as new as the saved ones. The scheduler and the dashboard read this every few seconds, for thousands of
        nodes: hardware and backends, which change only at Register, are parsed once per text."""
        if node_id is None:
            rows = self._db.execute("SELECT * FROM nodes ORDER BY name").fetchall()
        else:
            rows = self._db.execute("SELECT * FROM nodes WHERE id=?", (node_id,)).fetchall()
        nodes = []
        for r in rows:
            beat = self.liveness.latest(r["id"])
            if beat is None or beat.at < r["last_heartbeat"]:  # none since the head started, or registered since
                beat = Beat(r["last_heartbeat"], r["cpu_percent"], r["memory_percent"],
                            tuple(DevicePower.model_validate(p) for p in json.loads(r["power"])), r["busy"],
                            r["farm_cpu_percent"],
                            tuple(GpuMemory.model_validate(m) for m in json.loads(r["gpu_memory"])))
            nodes.append(Node(
                id=r["id"], name=r["name"], state=NodeState(r["state"]), hardware=_hardware(r["hardware"]),
                backends=_backends(r["backends"]), ray_node_id=r["ray_node_id"], address=r["address"],
                last_heartbeat=beat.at, registered_at=r["registered_at"], cpu_percent=beat.cpu_percent,
                memory_percent=beat.memory_percent, power=beat.power, busy=beat.busy, drain=bool(r["drain"]),
                farm_cpu_percent=beat.farm_cpu_percent, gpu_memory=beat.gpu_memory, trusted=bool(r["trusted"]),
            ))
        return nodes
