"""Jobs, their shards and their logs: an accepted job is here before its submitter hears of it, and survives the
head."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from farm.core.energy import Energy
from farm.core.errors import ConflictError, NotFoundError
from farm.core.redact import redact
from farm.core.frozen import Frozen
from farm.core.models import JobState, Node, Shard, ShardState
from farm.core.phases import ShardPhases, before_text, window_text
from farm.core.spec import JobKind
from farm.head.store.db import Database

SCHEMA = """
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
    finished_at REAL NOT NULL DEFAULT 0,
    run INTEGER NOT NULL DEFAULT 1  -- 1, then one more each time its missing rows run again (retries.py)
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
"""
# A shard's columns that are its model's fields by the same name (idx is its index; metrics is JSON).
SHARD_FIELDS = ("start", "stop", "state", "node_id", "node_name", "backend", "device", "items", "seconds",
                "error", "attempts", "energy_j", "energy_source", "energy_scope", "marginal_j", "peak_memory_bytes",
                "forward", "placed_at", "finished_at")


class Job(Frozen):
    """A job's row and its shards, as read from the store."""

    id: str
    name: str
    kind: JobKind
    state: JobState
    spec_yaml: str
    code_path: str
    output: str
    items: int
    model_key: str
    model_bytes: int
    error: str
    explanation: str
    metrics: dict[str, float]
    created_at: float
    started_at: float
    finished_at: float
    shards: tuple[Shard, ...]
    correct: int | None  # predictions matching the dataset's labels, when it has labels
    run: int = 1  # 1, then one more each time its missing rows ran again (farm.head.store.retries)

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


class JobRecords(Database):
    def _create(self) -> None:
        super()._create()
        self._db.executescript(SCHEMA)
        self._add_column("job_logs", "shard", "INTEGER")
        self._add_column("shards", "marginal_j", "REAL")
        self._add_column("shards", "metrics", "TEXT NOT NULL DEFAULT '{}'")
        self._add_column("shards", "forward", "TEXT NOT NULL DEFAULT ''")
        self._add_column("shards", "placed_at", "REAL NOT NULL DEFAULT 0")
        self._add_column("jobs", "run", "INTEGER NOT NULL DEFAULT 1")

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

    def unfinished_job_ids(self) -> list[str]:
        """The ids of the jobs queued or running (cheap: no shards read)."""
        states = [s.value for s in JobState if not s.finished]
        rows = self._db.execute(f"SELECT id FROM jobs WHERE state IN ({','.join('?' * len(states))})", states)
        return [str(row["id"]) for row in rows.fetchall()]

    def job(self, job_id: str) -> Job:
        row = self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no job {job_id!r}")
        return self._jobs([row])[0]

    def jobs(self, limit: int = 100, states: tuple[JobState, ...] | None = None) -> list[Job]:
        if states:
            marks = ",".join("?" * len(states))
            rows = self._db.execute(
                f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY seq", [s.value for s in states]
            ).fetchall()
        else:
            rows = self._db.execute("SELECT * FROM jobs ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
        return self._jobs(rows)

    def _jobs(self, rows: list[sqlite3.Row]) -> list[Job]:
        """The jobs of these rows with their shards, read in one query whatever their number."""
        shards: dict[str, list[sqlite3.Row]] = {row["id"]: [] for row in rows}
        if rows:
            found = self._db.execute(
                "SELECT * FROM shards WHERE job_id IN (SELECT value FROM json_each(?)) ORDER BY job_id, idx",
                (json.dumps(list(shards)),),
            )
            for r in found:
                shards[r["job_id"]].append(r)
        return [_job(row, shards[row["id"]]) for row in rows]

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
                    "UPDATE jobs SET state=?, error=?, finished_at=? WHERE id=?",
                    (state.value, redact(error), now, job_id)
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
                   error='', placed_at=? WHERE job_id=? AND idx=?""",
                (ShardState.RUNNING.value, node.id, node.name, backend, device, time.time(), job_id, index),
            )
            self._log(db, job_id, "info", f"shard {index} → {node.name} ({device})" + (f": {why}" if why else ""),
                      index)

    def shard_succeeded(
        self, job_id: str, index: int, items: int, seconds: float, correct: int | None, energy: Energy | None,
        peak_memory_bytes: int = 0, marginal_j: float | None = None, metrics: dict[str, float] | None = None,
        forward: str = "",
    ) -> None:
        """`marginal_j`: the part of `energy` above the device's idle draw (farm.core.energy.marginal_joules);
        `metrics`: the kind's own figures of the shard (an evaluate shard's loss); `forward`: the tuner's winner it
        ran ("" the untuned model)."""
        joules, source, scope = (energy.joules, energy.source.value, energy.scope.value) if energy else (0.0, "", "")
        with self._tx() as db:
            db.execute(
                """UPDATE shards SET state=?, items=?, seconds=?, correct=?, energy_j=?, energy_source=?,
                   energy_scope=?, marginal_j=?, metrics=?, peak_memory_bytes=?, forward=?, finished_at=?
                   WHERE job_id=? AND idx=?""",
                (ShardState.SUCCEEDED.value, items, seconds, correct, joules, source, scope,
                 marginal_j if energy else None, json.dumps(metrics or {}), peak_memory_bytes, forward, time.time(),
                 job_id, index),
            )
            spent = f", {joules:.3f} J ({source}, {scope})" if energy else ""
            if energy and marginal_j is not None:
                spent += f", {marginal_j:.3f} J above idle"
            if (phases := ShardPhases.of(metrics or {}, seconds)) is not None:
                spent += f"; before: {before_text(phases)}; in it: {window_text(phases, seconds)}"
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
            row = db.execute("SELECT start, stop, state FROM shards WHERE job_id=? AND idx=?",
                             (job_id, index)).fetchone()
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

    def running_shards_by_node(self) -> dict[str, int]:
        """How many shards each node runs now (a draining node with none is drained)."""
        rows = self._db.execute(
            "SELECT node_id, COUNT(*) AS n FROM shards WHERE state=? GROUP BY node_id", (ShardState.RUNNING.value,)
        ).fetchall()
        return {r["node_id"]: r["n"] for r in rows}

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

    # ---- deleting finished jobs

    def delete_jobs(self, job_ids: list[str]) -> list[Job]:
        """Remove these jobs' records (the job, its shards, its log) in one transaction, and return them as they were
        (their shards left out). All or none: an unknown id is NotFoundError, a job that has not ended is
        ConflictError, and then nothing is removed."""
        with self._tx() as db:
            rows = db.execute("SELECT * FROM jobs WHERE id IN (SELECT value FROM json_each(?)) ORDER BY seq",
                              (json.dumps(job_ids),)).fetchall()
            found = {row["id"]: row for row in rows}
            for job_id in job_ids:
                row = found.get(job_id)
                if row is None:
                    raise NotFoundError(f"no job {job_id!r}")
                if not JobState(row["state"]).finished:
                    raise ConflictError(f"job {job_id} is {row['state']}: only a finished job can be deleted "
                                        f"(cancel it first: farm cancel {job_id})")
            return self._delete(db, rows)

    def prune_jobs(self, finished_before: float, states: tuple[JobState, ...],
                   keep: Callable[[str], bool] = lambda job_id: False) -> list[Job]:
        """Remove the records of every job in one of `states` (finished ones) that ended before `finished_before`,
        but those `keep` names, in one transaction; return them as they were (their shards left out)."""
        if any(not state.finished for state in states):
            raise ConflictError("only finished jobs can be pruned (succeeded, failed or cancelled)")
        with self._tx() as db:
            rows = db.execute(
                "SELECT * FROM jobs WHERE state IN (SELECT value FROM json_each(?)) AND finished_at < ? ORDER BY seq",
                (json.dumps([s.value for s in states]), finished_before),
            ).fetchall()
            return self._delete(db, [row for row in rows if not keep(row["id"])])

    def job_outputs(self) -> set[str]:
        """Every output a job on record writes or wrote."""
        return {row["output"] for row in self._db.execute("SELECT DISTINCT output FROM jobs")}

    @staticmethod
    def _delete(db: sqlite3.Connection, rows: list[sqlite3.Row]) -> list[Job]:
        ids = json.dumps([row["id"] for row in rows])
        for table in ("job_logs", "shards", "jobs"):
            column = "id" if table == "jobs" else "job_id"
            db.execute(f"DELETE FROM {table} WHERE {column} IN (SELECT value FROM json_each(?))", (ids,))
        return [_job(row, []) for row in rows]

    # ---- logs

    def log(self, job_id: str, level: str, message: str, shard: int | None = None) -> None:
        self._log(self._db, job_id, level, message, shard)

    @staticmethod
    def _log(db: sqlite3.Connection, job_id: str, level: str, message: str, shard: int | None = None) -> None:
        # A dataset URL's user and password never reach the log (it is shown to whoever reads jobs).
        db.execute("INSERT INTO job_logs (job_id, ts, level, message, shard) VALUES (?, ?, ?, ?, ?)",
                   (job_id, time.time(), level, redact(message), shard))

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


def _job(row: sqlite3.Row, shards: list[sqlite3.Row]) -> Job:
    counted = [r["correct"] for r in shards if r["correct"] is not None]
    return Job(
        id=row["id"], name=row["name"], kind=JobKind(row["kind"]), state=JobState(row["state"]),
        spec_yaml=row["spec_yaml"], code_path=row["code_path"], output=row["output"], items=row["items"],
        model_key=row["model_key"], model_bytes=row["model_bytes"], error=row["error"],
        explanation=row["explanation"], metrics=json.loads(row["metrics"]), created_at=row["created_at"],
        started_at=row["started_at"], finished_at=row["finished_at"], correct=sum(counted) if counted else None,
        run=row["run"],
        shards=tuple(
            Shard(index=r["idx"], **{f: r[f] for f in SHARD_FIELDS}, metrics=json.loads(r["metrics"]))
            for r in shards
        ),
    )
