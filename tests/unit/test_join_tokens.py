"""Join tokens' use counts and rate (farm.head.auth, farm.head.store.tokens) and their commands (`farm head token`)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli import head as head_cli
from farm.core.errors import AuthError, NotFoundError, RateLimitError
from farm.head.auth import JoinRateLimiter, Tokens, hash_token
from farm.head.settings import HeadSettings
from farm.head.store import Store
from tests.conftest import ROOT


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_admits_per_minute_in_any_window_and_says_how_long_to_wait() -> None:
    clock = Clock()
    rate = JoinRateLimiter(per_minute=3, clock=clock)
    for _ in range(3):
        assert rate.wait_s("jt-a") == 0
        rate.joined("jt-a")
        clock.now += 10
    assert rate.wait_s("jt-a") == pytest.approx(30)  # the first join, at 1000, leaves the window at 1060
    assert rate.wait_s("jt-b") == 0  # per token
    clock.now += 30
    assert rate.wait_s("jt-a") == 0
    assert JoinRateLimiter(per_minute=0, clock=clock).wait_s("jt-a") == 0  # 0: no limit


def test_the_rate_remembers_a_bounded_number_of_joins() -> None:
    clock = Clock()
    rate = JoinRateLimiter(per_minute=5, clock=clock)
    for i in range(1000):
        rate.joined("jt-a")
    assert len(rate._joins["jt-a"]) == 5  # the last per_minute joins of a token, no more
    for i in range(JoinRateLimiter.MAX_TOKENS + 10):
        rate.joined(f"jt-{i}")
    assert len(rate._joins) <= JoinRateLimiter.MAX_TOKENS


def test_a_token_counts_its_uses_and_refuses_past_its_limit(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.add_join_token("jt-two", hash_token("two"), max_uses=2)
    store.add_join_token("jt-any", hash_token("any"))
    tokens = Tokens(join="j", api="a", join_rate=JoinRateLimiter(per_minute=100))
    for _ in range(2):
        tokens.check_join_room("jt-two", store)
        tokens.use_join("jt-two", store)
    with pytest.raises(AuthError, match="^join token jt-two has been used 2 times, its limit$"):
        tokens.check_join_room("jt-two", store)
    with pytest.raises(AuthError, match="has been used 2 times"):  # counted and checked at once, too
        store.use_join_token("jt-two")
    with pytest.raises(NotFoundError):
        store.use_join_token("jt-none")
    for _ in range(5):
        tokens.use_join("jt-any", store)  # max_uses 0: no limit
    assert {r["id"]: (r["uses"], r["max_uses"]) for r in store.join_tokens()} == {"jt-two": (2, 2), "jt-any": (5, 0)}
    store.close()


def test_past_its_rate_a_join_is_refused_with_the_wait(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.add_join_token("jt-a", hash_token("a"))
    tokens = Tokens("j", "a").for_server(HeadSettings(state_dir=tmp_path, join_rate_per_min=2))
    for _ in range(2):
        tokens.check_join_room("jt-a", store)
        tokens.use_join("jt-a", store)
    with pytest.raises(RateLimitError, match=r"^join token jt-a let in 2 new nodes in the last minute, its limit: "
                                             r"try again in \d+ s$"):
        tokens.check_join_room("jt-a", store)
    store.close()


def test_a_store_written_before_use_counts_gains_them_and_a_rotated_token_counts_afresh(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("CREATE TABLE join_tokens (id TEXT PRIMARY KEY, hash TEXT UNIQUE NOT NULL, created_at REAL NOT NULL, "
               "expires_at REAL NOT NULL DEFAULT 0, revoked INTEGER NOT NULL DEFAULT 0, "
               "description TEXT NOT NULL DEFAULT '')")
    db.execute("INSERT INTO join_tokens (id, hash, created_at) VALUES ('default', 'h1', 1)")
    db.commit()
    db.close()
    store = Store(tmp_path / "state.db")
    assert [(r["uses"], r["max_uses"]) for r in store.join_tokens()] == [(0, 0)]
    store.use_join_token("default")
    store.keep_join_token("default", "h1")  # the same secret: its count stays
    assert store.join_tokens()[0]["uses"] == 1
    store.keep_join_token("default", "h2")  # a new secret is a new token
    assert store.join_tokens()[0]["uses"] == 0
    store.close()


def test_token_list_shows_uses_and_their_limit(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.add_join_token("jt-two", hash_token("two"), max_uses=2, description="two macs")
    store.add_join_token("jt-any", hash_token("any"))
    store.use_join_token("jt-two")
    store.use_join_token("jt-two")
    store.use_join_token("jt-any")
    store.close()
    shown = CliRunner().invoke(head_cli.app, ["token", "list", "--state-dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "jt-two       used up  uses 2 of 2 " in shown.stdout and "two macs" in shown.stdout
    assert "jt-any       valid    uses 1 " in shown.stdout
    listed = CliRunner().invoke(head_cli.app, ["token", "list", "--json", "--state-dir", str(tmp_path)])
    assert [(r["id"], r["uses"], r["max_uses"]) for r in json.loads(listed.stdout)] == [("jt-two", 2, 2),
                                                                                         ("jt-any", 1, 0)]
    created = CliRunner().invoke(head_cli.app, ["token", "create", "--max-uses", "3", "--state-dir", str(tmp_path)])
    assert created.exit_code == 0 and ", for 3 new nodes)" in created.stdout


@pytest.mark.parametrize("argv", [
    ["head", "token", "create", "--max-uses", "0"],
    ["head", "token", "create", "--max-uses", "many"],
    ["head", "start", "--join-rate", "-1"],
])
def test_a_bad_max_uses_or_join_rate_is_one_line_and_exit_2(tmp_path: Path, argv: list[str]) -> None:
    Store(tmp_path / "state.db").close()
    bad = subprocess.run([sys.executable, "-m", "farm.cli.main", *argv, "--state-dir", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (bad.returncode, bad.stderr.strip().count("\n")) == (2, 0), bad.stderr
    assert f"{argv[-2]} {argv[-1]!r}" in bad.stderr and "Traceback" not in bad.stderr
    assert [r["id"] for r in Store(tmp_path / "state.db").join_tokens()] == []  # nothing made
