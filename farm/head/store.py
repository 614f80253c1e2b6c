"""The head's state: nodes, jobs, shards and job logs in SQLite (WAL), so that an accepted job survives the head.

All calls happen on the head's event-loop thread; each is a short transaction.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.core.energy import DevicePower, Energy
from farm.core.errors import ConflictError, NotFoundError
from farm.core.models import BackendOffer, Hardware, JobState, Node, NodeState, Shard, ShardState
from farm.head.liveness import Beat, Liveness, NodeLiveness
from farm.scheduler.calibration import RECENT, Sample

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
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    spec_yaml TEXT NOT NULL,
    code_path TEXT NOT NULL,
    output TEXT NOT NULL,
    items INTEGER NOT NULL,
    model_key TEXT NOT NULL DEFAULT '',
    model_bytes INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    explanation TEXT NOT NULL DEFAULT '',
    metrics TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    started_at REAL NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS shards (
    job_id TEXT NOT NULL REFERENCES jobs(id),
    idx INTEGER NOT NULL,
    start INTEGER NOT NULL,
    stop INTEGER NOT NULL,
    state TEXT NOT NULL,
    node_id TEXT NOT NULL DEFAULT '',
    node_name TEXT NOT NULL DEFAULT '',
    backend TEXT NOT NULL DEFAULT '',
    device TEXT NOT NULL DEFAULT '',
    items INTEGER NOT NULL DEFAULT 0,
    seconds REAL NOT NULL DEFAULT 0,
    correct INTEGER,
    energy_j REAL NOT NULL DEFAULT 0,
    energy_source TEXT NOT NULL DEFAULT '',
    energy_scope TEXT NOT NULL DEFAULT '',
    marginal_j REAL,
    metrics TEXT NOT NULL DEFAULT '{}',
    peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS job_logs (
    job_id TEXT NOT NULL,
    ts REAL NOT NULL,
    level TEXT NOT NULL,
    message TEXT NOT NULL,
    shard INTEGER  -- the shard a line is about (its output, its traceback); NULL: the job's own line
);
CREATE INDEX IF NOT EXISTS job_logs_job ON job_logs(job_id, ts);
CREATE TABLE IF NOT EXISTS join_tokens (
    id TEXT PRIMARY KEY,
    hash TEXT UNIQUE NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL DEFAULT 0,
    revoked INTEGER NOT NULL DEFAULT 0,
    description TEXT NOT NULL DEFAULT ''
);
"""


class Job:
    """A job's row and its shards, as read from the store."""

    def __init__(self, row: sqlite3.Row, shards: list[Shard], correct: int | None) -> None:
        self.id: str = row["id"]
        self.name: str = row["name"]
        self.kind: str = row["kind"]
        self.state = JobState(row["state"])
        self.spec_yaml: str = row["spec_yaml"]
        self.code_path: str = row["code_path"]
        self.output: str = row["output"]
        self.items: int = row["items"]
        self.model_key: str = row["model_key"]
        self.model_bytes: int = row["model_bytes"]
        self.error: str = row["error"]
        self.explanation: str = row["explanation"]
        self.metrics: dict[str, float] = json.loads(row["metrics"])
        self.created_at: float = row["created_at"]
        self.started_at: float = row["started_at"]
        self.finished_at: float = row["finished_at"]
        self.shards = shards
        self.correct = correct  # predictions matching the dataset's labels, when it has labels

    @property
    def items_done(self) -> int:
        return sum(s.items for s in self.shards if s.state is ShardState.SUCCEEDED)

    @property
    def energy_j(self) -> float:
        return sum(s.energy_j for s in self.shards if s.state is ShardState.SUCCEEDED)

    @property
    def energy_sources(self) -> list[str]:
        return sorted({s.energy_source for s in self.shards if s.state is ShardState.SUCCEEDED and s.energy_source})

    @property
    def marginal_j(self) -> float | None:
        """The finished shards' energy above their devices' idle draw; None unless every measured one has it."""
        measured = [s for s in self.shards if s.state is ShardState.SUCCEEDED and s.energy_source]
        if not measured or any(s.marginal_j is None for s in measured):
            return None
        return sum(s.marginal_j or 0.0 for s in measured)


@dataclass(frozen=True)
class NodeWork:
    """What a node's finished shards add up to, per energy source and scope (all time)."""

    node_id: str
    node_name: str
    energy_source: str
    energy_scope: str
    shards: int
    items: int
    seconds: float
    energy_j: float
    marginal_j: float | None  # None unless every one of these shards has a marginal figure


@functools.lru_cache(maxsize=65536)
def _hardware(text: str) -> Hardware:
    return Hardware.model_validate_json(text)


@functools.lru_cache(maxsize=65536)
def _backends(text: str) -> tuple[BackendOffer, ...]:
    return tuple(BackendOffer.model_validate(b) for b in json.loads(text))


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.liveness = Liveness()  # the latest heartbeats, between two save_heartbeats
        self._node_states: dict[str, NodeState] = {}  # node_state's cache; every write of a state drops its entry
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """Columns added since a store was first written: added to an older file in place (CREATE TABLE IF NOT
        EXISTS leaves an existing table as it was)."""
        node_columns = {r["name"] for r in self._db.execute("PRAGMA table_info(nodes)")}
        if "drain" not in node_columns:
            self._db.execute("ALTER TABLE nodes ADD COLUMN drain INTEGER NOT NULL DEFAULT 0")
        if "shard" not in {r["name"] for r in self._db.execute("PRAGMA table_info(job_logs)")}:
            self._db.execute("ALTER TABLE job_logs ADD COLUMN shard INTEGER")
        shard_columns = {r["name"] for r in self._db.execute("PRAGMA table_info(shards)")}
        if "marginal_j" not in shard_columns:
            self._db.execute("ALTER TABLE shards ADD COLUMN marginal_j REAL")
        if "metrics" not in shard_columns:
            self._db.execute("ALTER TABLE shards ADD COLUMN metrics TEXT NOT NULL DEFAULT '{}'")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ---- join tokens (farm.head.auth): hashes only, never the tokens

    def add_join_token(self, token_id: str, token_hash: str, expires_at: float = 0.0, description: str = "") -> None:
        with self._tx() as db:
            db.execute("INSERT INTO join_tokens (id, hash, created_at, expires_at, description) VALUES (?, ?, ?, ?, ?)",
                       (token_id, token_hash, time.time(), expires_at, description))

    def keep_join_token(self, token_id: str, token_hash: str) -> None:
        """Make sure the record `token_id` holds this hash; a new hash (a rotated secret) is a new, unrevoked token."""
        with self._tx() as db:
            db.execute(
                """INSERT INTO join_tokens (id, hash, created_at) VALUES (?, ?, ?)
                   ON CONFLICT(id) DO UPDATE SET hash=excluded.hash, created_at=excluded.created_at, revoked=0
                   WHERE join_tokens.hash != excluded.hash""",
                (token_id, token_hash, time.time()),
            )

    def join_token(self, token_hash: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM join_tokens WHERE hash=?", (token_hash,)).fetchone()
        return None if row is None else dict(row)

    def join_tokens(self) -> list[dict[str, Any]]:
        """Every join token's record but its hash, oldest first."""
        rows = self._db.execute("SELECT id, created_at, expires_at, revoked, description FROM join_tokens "
                                "ORDER BY created_at, id")
        return [dict(r) for r in rows]

    def revoke_join_token(self, token_id: str) -> None:
        with self._tx() as db:
            if db.execute("UPDATE join_tokens SET revoked=1 WHERE id=?", (token_id,)).rowcount == 0:
                raise NotFoundError(f"no join token {token_id}")

    # ---- nodes

    def upsert_node(
        self, node_id: str, name: str, hardware: Hardware, backends: list[BackendOffer], address: str, token_hash: str
    ) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute(
                """INSERT INTO nodes (id, name, state, hardware, backends, address, token_hash, registered_at,
                                      last_heartbeat)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT(id) DO UPDATE SET name=excluded.name, state=excluded.state,
                     hardware=excluded.hardware, backends=excluded.backends, address=excluded.address,
                     token_hash=excluded.token_hash, ray_node_id='', last_heartbeat=excluded.last_heartbeat""",
                (
                    node_id, name, NodeState.JOINING.value, hardware.model_dump_json(),
                    json.dumps([b.model_dump(mode="json") for b in backends]), address, token_hash, now, now,
                ),
            )
        self._node_states.pop(node_id, None)  # back to joining

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
                  busy: str = "") -> None:
        """Kept in memory (self.liveness) until the next save_heartbeats: no SQL per beat."""
        self.liveness.record(node_id, Beat(time.time(), cpu_percent, memory_percent, power, busy))

    def save_heartbeats(self, beats: Sequence[tuple[str, Beat]] | None = None) -> int:
        """Write heartbeats (by default all received since the last save, the latest per node) in one transaction;
        how many. A beat older than what a node's row already has (a later save, a Register) changes nothing."""
        beats = self.liveness.take_unsaved() if beats is None else beats
        if beats:
            with self._tx() as db:
                db.executemany(
                    """UPDATE nodes SET last_heartbeat=?, cpu_percent=?, memory_percent=?, power=?, busy=?
                       WHERE id=? AND last_heartbeat <= ?""",
                    [(b.at, b.cpu_percent, b.memory_percent, "[" + ",".join(p.model_dump_json() for p in b.power) + "]",
                      b.busy, node_id, b.at) for node_id, b in beats],
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

    def running_shards_by_node(self) -> dict[str, int]:
        """How many shards each node runs now (a draining node with none is drained)."""
        rows = self._db.execute(
            "SELECT node_id, COUNT(*) AS n FROM shards WHERE state=? GROUP BY node_id", (ShardState.RUNNING.value,)
        ).fetchall()
        return {r["node_id"]: r["n"] for r in rows}

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
                            tuple(DevicePower.model_validate(p) for p in json.loads(r["power"])), r["busy"])
            nodes.append(Node(
                id=r["id"], name=r["name"], state=NodeState(r["state"]), hardware=_hardware(r["hardware"]),
                backends=_backends(r["backends"]), ray_node_id=r["ray_node_id"], address=r["address"],
                last_heartbeat=beat.at, registered_at=r["registered_at"], cpu_percent=beat.cpu_percent,
                memory_percent=beat.memory_percent, power=beat.power, busy=beat.busy, drain=bool(r["drain"]),
            ))
        return nodes

    # ---- jobs

    def add_job(
        self, job_id: str, name: str, kind: str, spec_yaml: str, code_path: str, output: str, items: int,
        ranges: list[tuple[int, int]], model_key: str = "", model_bytes: int = 0,
    ) -> None:
        with self._tx() as db:
            db.execute(
                """INSERT INTO jobs (id, name, kind, state, spec_yaml, code_path, output, items, model_key, model_bytes,
                   created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (job_id, name, kind, JobState.QUEUED.value, spec_yaml, code_path, output, items, model_key,
                 model_bytes, time.time()),
            )
            db.executemany(
                "INSERT INTO shards (job_id, idx, start, stop, state) VALUES (?, ?, ?, ?, ?)",
                [(job_id, i, a, b, ShardState.PENDING.value) for i, (a, b) in enumerate(ranges)],
            )
            shards = f"{len(ranges)} shards" if ranges else "shards cut as it runs, sized to the devices"
            self._log(db, job_id, "info", f"accepted: {items} items in {shards}")

    def add_shards(self, job_id: str, ranges: list[tuple[int, int]]) -> list[int]:
        """New pending shards after the job's last (a kind that cuts its work as the job runs); their indexes."""
        with self._tx() as db:
            (last,) = db.execute("SELECT COALESCE(MAX(idx), -1) FROM shards WHERE job_id=?", (job_id,)).fetchone()
            db.executemany(
                "INSERT INTO shards (job_id, idx, start, stop, state) VALUES (?, ?, ?, ?, ?)",
                [(job_id, last + 1 + i, a, b, ShardState.PENDING.value) for i, (a, b) in enumerate(ranges)],
            )
            return [last + 1 + i for i in range(len(ranges))]

    def job_state(self, job_id: str) -> JobState:
        row = self._db.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no job {job_id!r}")
        return JobState(row["state"])

    def job(self, job_id: str) -> Job:
        row = self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no job {job_id!r}")
        return self._job(row)

    def _job(self, row: sqlite3.Row) -> Job:
        rows = self._db.execute("SELECT * FROM shards WHERE job_id=? ORDER BY idx", (row["id"],)).fetchall()
        shards = [
            Shard(
                index=r["idx"], start=r["start"], stop=r["stop"], state=ShardState(r["state"]), node_id=r["node_id"],
                node_name=r["node_name"], backend=r["backend"], items=r["items"], seconds=r["seconds"],
                error=r["error"], attempts=r["attempts"], energy_j=r["energy_j"], energy_source=r["energy_source"],
                energy_scope=r["energy_scope"], device=r["device"], peak_memory_bytes=r["peak_memory_bytes"],
                marginal_j=r["marginal_j"], metrics=json.loads(r["metrics"]),
            )
            for r in rows
        ]
        counted = [r["correct"] for r in rows if r["correct"] is not None]
        return Job(row, shards, sum(counted) if counted else None)

    def jobs(self, limit: int = 100, states: tuple[JobState, ...] | None = None) -> list[Job]:
        if states:
            marks = ",".join("?" * len(states))
            rows = self._db.execute(
                f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY seq", [s.value for s in states]
            ).fetchall()
        else:
            rows = self._db.execute("SELECT * FROM jobs ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
        return [self._job(r) for r in rows]

    def set_job_state(self, job_id: str, state: JobState, error: str = "") -> None:
        now = time.time()
        with self._tx() as db:
            if state is JobState.RUNNING:
                db.execute(
                    "UPDATE jobs SET state=?, started_at=CASE WHEN started_at=0 THEN ? ELSE started_at END WHERE id=?",
                    (state.value, now, job_id),
                )
            else:
                db.execute(
                    "UPDATE jobs SET state=?, error=?, finished_at=? WHERE id=?", (state.value, error, now, job_id)
                )
            if state is JobState.CANCELLED or state is JobState.FAILED:
                db.execute(
                    "UPDATE shards SET state=? WHERE job_id=? AND state IN (?, ?)",
                    (ShardState.CANCELLED.value, job_id, ShardState.PENDING.value, ShardState.RUNNING.value),
                )
            self._log(db, job_id, "error" if error else "info", f"job {state.value}" + (f": {error}" if error else ""))

    def set_metrics(self, job_id: str, metrics: dict[str, float]) -> None:
        self._db.execute("UPDATE jobs SET metrics=? WHERE id=?", (json.dumps(metrics), job_id))

    def set_explanation(self, job_id: str, explanation: str) -> None:
        self._db.execute("UPDATE jobs SET explanation=? WHERE id=?", (explanation, job_id))

    # ---- shards

    def shard_started(self, job_id: str, index: int, node: Node, backend: str, device: str, why: str = "") -> None:
        with self._tx() as db:
            db.execute(
                """UPDATE shards SET state=?, node_id=?, node_name=?, backend=?, device=?, attempts=attempts+1,
                   error='' WHERE job_id=? AND idx=?""",
                (ShardState.RUNNING.value, node.id, node.name, backend, device, job_id, index),
            )
            self._log(db, job_id, "info", f"shard {index} → {node.name} ({device})" + (f": {why}" if why else ""),
                      index)

    def shard_succeeded(
        self, job_id: str, index: int, items: int, seconds: float, correct: int | None, energy: Energy | None,
        peak_memory_bytes: int = 0, marginal_j: float | None = None, metrics: dict[str, float] | None = None,
    ) -> None:
        """`marginal_j`: the part of `energy` above the device's idle draw (farm.core.energy.marginal_joules);
        `metrics`: the kind's own figures of the shard (an evaluate shard's loss)."""
        joules, source, scope = (energy.joules, energy.source.value, energy.scope.value) if energy else (0.0, "", "")
        with self._tx() as db:
            db.execute(
                """UPDATE shards SET state=?, items=?, seconds=?, correct=?, energy_j=?, energy_source=?, energy_scope=?,
                   marginal_j=?, metrics=?, peak_memory_bytes=?, finished_at=? WHERE job_id=? AND idx=?""",
                (ShardState.SUCCEEDED.value, items, seconds, correct, joules, source, scope,
                 marginal_j if energy else None, json.dumps(metrics or {}), peak_memory_bytes, time.time(), job_id,
                 index),
            )
            spent = f", {joules:.3f} J ({source}, {scope})" if energy else ""
            if energy and marginal_j is not None:
                spent += f", {marginal_j:.3f} J above idle"
            self._log(db, job_id, "info", f"shard {index} done: {items} items in {seconds:.3f} s{spent}", index)

    def shard_requeued(self, job_id: str, index: int, error: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE shards SET state=?, error=? WHERE job_id=? AND idx=?",
                (ShardState.PENDING.value, error, job_id, index),
            )
            self._log(db, job_id, "warning", f"shard {index} goes back to the queue: {error}", index)

    def split_shard(self, job_id: str, index: int, at: int) -> int:
        """A pending shard [start, stop) becomes [start, at), and [at, stop) a new pending shard after the job's
        last: an auto-sized job's device takes the front of a range that never ran. The new shard's index."""
        with self._tx() as db:
            row = db.execute("SELECT start, stop, state FROM shards WHERE job_id=? AND idx=?", (job_id, index)).fetchone()
            if row is None or row["state"] != ShardState.PENDING.value or not row["start"] < at < row["stop"]:
                raise ConflictError(f"shard {index} of job {job_id} cannot be split at {at}")
            (last,) = db.execute("SELECT MAX(idx) FROM shards WHERE job_id=?", (job_id,)).fetchone()
            db.execute("UPDATE shards SET stop=? WHERE job_id=? AND idx=?", (at, job_id, index))
            db.execute("INSERT INTO shards (job_id, idx, start, stop, state) VALUES (?, ?, ?, ?, ?)",
                       (job_id, last + 1, at, row["stop"], ShardState.PENDING.value))
            self._log(db, job_id, "info", f"shard {index} cut at {at}: its rest [{at}, {row['stop']}) is shard "
                                          f"{last + 1}")
            return int(last + 1)

    def shard_failed(self, job_id: str, index: int, error: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE shards SET state=?, error=? WHERE job_id=? AND idx=?",
                (ShardState.FAILED.value, error, job_id, index),
            )
            self._log(db, job_id, "error", f"shard {index} failed: {error}", index)

    def samples(self, model_key: str, per_device: int = RECENT) -> list[Sample]:
        """The latest finished shards of a model, per (node, device): what calibration learns from."""
        rows = self._db.execute(
            """SELECT node_id, device, items, seconds, energy_j, energy_source, marginal_j, finished_at FROM (
                 SELECT s.*, ROW_NUMBER() OVER (PARTITION BY s.node_id, s.device ORDER BY s.finished_at DESC) AS n
                 FROM shards s JOIN jobs j ON j.id = s.job_id
                 WHERE j.model_key = ? AND s.state = ? AND s.seconds > 0)
               WHERE n <= ?""",
            (model_key, ShardState.SUCCEEDED.value, per_device),
        ).fetchall()
        return [
            Sample(node_id=r["node_id"], device=r["device"], items=r["items"], seconds=r["seconds"],
                   energy_j=r["energy_j"], energy_source=r["energy_source"], marginal_j=r["marginal_j"],
                   finished_at=r["finished_at"])
            for r in rows
        ]

    def peak_memory(self, model_key: str) -> dict[str, int]:
        """Per backend, the most memory a finished shard of this model has taken."""
        rows = self._db.execute(
            """SELECT s.backend, MAX(s.peak_memory_bytes) AS peak FROM shards s JOIN jobs j ON j.id = s.job_id
               WHERE j.model_key = ? AND s.state = ? AND s.peak_memory_bytes > 0 GROUP BY s.backend""",
            (model_key, ShardState.SUCCEEDED.value),
        ).fetchall()
        return {r["backend"]: r["peak"] for r in rows}

    def work_by_node(self) -> list[NodeWork]:
        """Per node and energy source, the finished shards' items, seconds and joules: the dashboard's perf/W and
        energy counters (read-only)."""
        rows = self._db.execute(
            """SELECT node_id, MAX(node_name) AS node_name, energy_source, energy_scope, COUNT(*) AS shards,
                      SUM(items) AS items, SUM(seconds) AS seconds, SUM(energy_j) AS energy_j,
                      CASE WHEN COUNT(marginal_j) = COUNT(*) THEN SUM(marginal_j) END AS marginal_j
               FROM shards WHERE state = ? GROUP BY node_id, energy_source, energy_scope""",
            (ShardState.SUCCEEDED.value,),
        ).fetchall()
        return [NodeWork(**dict(r)) for r in rows]

    def job_counts(self) -> dict[str, int]:
        """How many jobs are in each state (read-only)."""
        rows = self._db.execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state").fetchall()
        return {r["state"]: r["n"] for r in rows}

    def requeue_running(self) -> int:
        """After a head restart: shards that were running belonged to the old Ray driver and died with it."""
        with self._tx() as db:
            cursor = db.execute(
                "UPDATE shards SET state=? WHERE state=?", (ShardState.PENDING.value, ShardState.RUNNING.value)
            )
            return cursor.rowcount

    # ---- logs

    def log(self, job_id: str, level: str, message: str, shard: int | None = None) -> None:
        self._log(self._db, job_id, level, message, shard)

    @staticmethod
    def _log(db: sqlite3.Connection, job_id: str, level: str, message: str, shard: int | None = None) -> None:
        db.execute("INSERT INTO job_logs (job_id, ts, level, message, shard) VALUES (?, ?, ?, ?, ?)",
                   (job_id, time.time(), level, message, shard))

    def logs(self, job_id: str, shard: int | None = None, after: int = 0) -> list[dict[str, Any]]:
        """The job's log lines in order, each with its id (`after` an id: only the lines written since it); with
        `shard`, only that shard's lines."""
        self.job(job_id)  # NotFoundError for an unknown id
        query = "SELECT rowid AS id, ts, level, message, shard FROM job_logs WHERE job_id=? AND rowid>?"
        args: tuple[Any, ...] = (job_id, after)
        if shard is not None:
            query, args = query + " AND shard=?", (*args, shard)
        rows = self._db.execute(query + " ORDER BY rowid", args)
        return [dict(r) for r in rows.fetchall()]
