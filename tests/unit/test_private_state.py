"""State files are their owner's alone (issue 18, finding 15): the store and SQLite's files beside it are made 0600,
and a head or agent starting on an older state folder tightens it (tests/integration/test_private_head.py checks a
running farm's)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from farm.head.store import Store
from farm.local import keep_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_store_and_its_wal_are_made_0600(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.add_job("j-1", "toy", "inference", "name: toy\n", "/code.zip", "/out", 10, [(0, 10)])
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == ["state.db", "state.db-shm", "state.db-wal"]
    assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    store.close()


def test_an_older_state_folder_is_tightened_and_nothing_outside_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "jobs" / "j-1").mkdir(parents=True, mode=0o755)
    for path in (state / "state.db", state / "head.log", state / "jobs" / "j-1" / "code.zip"):
        path.write_text("x")
        path.chmod(0o644)
    state.chmod(0o755)
    outside = tmp_path / "shared.txt"
    outside.write_text("not the head's")
    outside.chmod(0o644)
    (state / "link").symlink_to(outside)
    keep_private(state)
    assert {mode(p) for p in (state, state / "jobs", state / "jobs" / "j-1")} == {0o700}
    assert {mode(p) for p in (state / "state.db", state / "head.log", state / "jobs" / "j-1" / "code.zip")} == {0o600}
    assert mode(outside) == 0o644  # a link is not followed
    assert os.readlink(state / "link") == str(outside)
