"""The tuner's winners the farm shares: one per farm.core.tuning.WinnerKey (GPU model, driver, torch, the job's
model key, the batch's input shapes, tolerance, objective), reported by the node that found it and handed with their
shards to the next jobs of that model (farm.head.tuning)."""

from __future__ import annotations

import json
import time

from farm.core.tuning import Objective, SharedWinner, WinnerKey
from farm.head.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS winners (
    digest TEXT PRIMARY KEY,
    model_key TEXT NOT NULL,
    atol REAL NOT NULL,
    rtol REAL NOT NULL,
    objective TEXT NOT NULL,
    device_name TEXT NOT NULL,
    driver TEXT NOT NULL,
    torch_version TEXT NOT NULL,
    input_shapes TEXT NOT NULL,
    winner TEXT NOT NULL,
    params TEXT NOT NULL,
    job_id TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS winners_by_model ON winners (model_key, objective);
"""
MAX_SHARED = 8  # winners handed with one shard (one per GPU kind, torch and batch shape the model ran on)


class WinnerRecords(Database):
    def _create(self) -> None:
        super()._create()
        self._db.executescript(SCHEMA)

    def put_winner(self, shared: SharedWinner, job_id: str) -> None:
        """A node's winner (checked on arrival: farm.proto.convert.tuning_from_pb), replacing its key's last."""
        k = shared.key
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO winners VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (k.digest(), k.model_key, k.atol, k.rtol, k.objective.value, k.device_name, k.driver,
                        k.torch_version, json.dumps(list(k.input_shapes)), shared.winner,
                        json.dumps([list(p) for p in shared.params]), job_id, time.time()))

    def drop_winner(self, key: WinnerKey) -> None:
        """A winner that lost in a job's own shards is shared no more."""
        with self._tx() as db:
            db.execute("DELETE FROM winners WHERE digest=?", (key.digest(),))

    def winners_for(self, model_key: str, atol: float, rtol: float, objective: Objective) -> list[SharedWinner]:
        """The winners for a job's model, tolerance and objective, newest first: each node keeps the one that fits
        its GPU, driver, torch and batch shapes (farm.core.tuning.WinnerKey.fits)."""
        rows = self._db.execute(
            "SELECT * FROM winners WHERE model_key=? AND atol=? AND rtol=? AND objective=? "
            "ORDER BY updated_at DESC LIMIT ?", (model_key, atol, rtol, objective.value, MAX_SHARED)).fetchall()
        return [SharedWinner(
            key=WinnerKey(device_name=r["device_name"], driver=r["driver"], torch_version=r["torch_version"],
                          model_key=r["model_key"], input_shapes=tuple(json.loads(r["input_shapes"])), atol=r["atol"],
                          rtol=r["rtol"], objective=Objective(r["objective"])),
            winner=r["winner"], params=tuple((str(n), v) for n, v in json.loads(r["params"]))) for r in rows]
