"""The store's connection: SQLite in WAL mode, one short transaction per call (farm.head.store)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Database:
    """The connection every part of the store shares. Each part creates its tables (and adds the columns an older
    file lacks) in `_create`, calling its parents' first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Made 0600 before SQLite makes it (0644): the WAL and shared-memory files take the database file's mode.
        path.touch(mode=0o600, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
        self._db.execute("PRAGMA foreign_keys=ON")
        self._create()

    def _create(self) -> None:
        """Tables, and columns added since a store was first written: added to an older file in place (CREATE TABLE
        IF NOT EXISTS leaves an existing table as it was)."""

    def _add_column(self, table: str, column: str, definition: str) -> None:
        if column not in {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}:
            self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

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
