"""Join tokens (farm.head.auth): their hashes only, never the tokens; and how many nodes each has let in (`uses`,
under `max_uses`, 0: no limit)."""

from __future__ import annotations

import time
from typing import Any

from farm.core.errors import AuthError, NotFoundError
from farm.head.store.db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS join_tokens (
    id TEXT PRIMARY KEY,
    hash TEXT UNIQUE NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL DEFAULT 0,
    revoked INTEGER NOT NULL DEFAULT 0,
    description TEXT NOT NULL DEFAULT ''
);
"""


class TokenRecords(Database):
    def _create(self) -> None:
        super()._create()
        self._db.executescript(SCHEMA)
        self._add_column("join_tokens", "uses", "INTEGER NOT NULL DEFAULT 0")  # nodes it let in
        self._add_column("join_tokens", "max_uses", "INTEGER NOT NULL DEFAULT 0")  # 0: no limit

    def add_join_token(self, token_id: str, token_hash: str, expires_at: float = 0.0, description: str = "",
                       max_uses: int = 0) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO join_tokens (id, hash, created_at, expires_at, description, max_uses) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (token_id, token_hash, time.time(), expires_at, description,
                                                     max_uses))

    def keep_join_token(self, token_id: str, token_hash: str) -> None:
        """Make sure the record `token_id` holds this hash; a new hash (a rotated secret) is a new, unrevoked token."""
        with self._tx() as db:
            db.execute(
                """INSERT INTO join_tokens (id, hash, created_at) VALUES (?, ?, ?)
                   ON CONFLICT(id) DO UPDATE SET hash=excluded.hash, created_at=excluded.created_at, revoked=0,
                   uses=0
                   WHERE join_tokens.hash != excluded.hash""",
                (token_id, token_hash, time.time()),
            )

    def join_token(self, token_hash: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM join_tokens WHERE hash=?", (token_hash,)).fetchone()
        return None if row is None else dict(row)

    def join_token_by_id(self, token_id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM join_tokens WHERE id=?", (token_id,)).fetchone()
        return None if row is None else dict(row)

    def join_tokens(self) -> list[dict[str, Any]]:
        """Every join token's record but its hash, oldest first."""
        rows = self._db.execute("SELECT id, created_at, expires_at, revoked, description, uses, max_uses "
                                "FROM join_tokens ORDER BY created_at, id")
        return [dict(r) for r in rows]

    def revoke_join_token(self, token_id: str) -> None:
        with self._tx() as db:
            if db.execute("UPDATE join_tokens SET revoked=1 WHERE id=?", (token_id,)).rowcount == 0:
                raise NotFoundError(f"no join token {token_id}")

    def use_join_token(self, token_id: str) -> None:
        """Count a node let in by the token, unless that would pass its `max_uses`: checked and counted in one
        statement, so two joins at once cannot both take its last use."""
        with self._tx() as db:
            if db.execute("UPDATE join_tokens SET uses=uses+1 WHERE id=? AND (max_uses=0 OR uses<max_uses)",
                          (token_id,)).rowcount:
                return
            row = db.execute("SELECT uses FROM join_tokens WHERE id=?", (token_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no join token {token_id}")
        raise AuthError(used_up(token_id, int(row["uses"])))


def used_up(token_id: str, uses: int) -> str:
    """The refusal of a join token at its use limit, in one line."""
    return f"join token {token_id} has been used {uses} times, its limit"
