"""A join line is pasted whole into another machine's shell: the CLI never wraps it, whatever the width."""

from __future__ import annotations

import json
from pathlib import Path

from farm.head.store import Store
from tests.conftest import farm


def test_a_join_line_is_one_line_however_long(tmp_path: Path) -> None:
    Store(tmp_path / "state.db").close()
    address = "a-rather-long-host-name.lab.example.org:7700"
    (tmp_path / "head.json").write_text(json.dumps({"address": address, "tls": False}))
    made = farm("head", "token", "create", "--state-dir", str(tmp_path), env={"COLUMNS": "60"})
    assert made.returncode == 0, made.stderr
    join = [line for line in made.stdout.splitlines() if "farm agent start" in line]
    assert len(join) == 1 and join[0].rstrip().endswith(f"--head {address} --insecure"), made.stdout
