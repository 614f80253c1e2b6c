"""`farm agent status` reports agents started by hand (no service): running or not, pid, head, node id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from farm.cli import agent as agent_cli
from farm.local import this_process, write_json


def test_an_agent_started_by_hand_is_reported_running_and_one_stopped_as_not(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no service installed for this user
    state = tmp_path / "state"
    write_json(state / "agents" / "box" / "node.json",
               {"node_id": "n-1a2b3c4d", "node_token": "secret", "mtls_port": 7703, "head": "10.0.0.5:7700"})
    write_json(state / "agents" / "box" / "agent.json",
               {**this_process(), "name": "box", "node_id": "n-1a2b3c4d", "head": "10.0.0.5:7700", "state": "ready"})
    write_json(state / "agents" / "old" / "node.json", {"node_id": "n-00ff00ff", "head": "10.0.0.5:7700"})

    def status(*args: str) -> str:
        result = CliRunner().invoke(agent_cli.app, ["status", "--state-dir", str(state), *args])
        assert result.exit_code == 0, result.output
        return result.output

    text = status()
    assert "agent service not installed" in text
    assert f"agent box (not a service) -> head 10.0.0.5:7700, node n-1a2b3c4d: ready (pid {this_process()['pid']})" \
        in text
    assert "agent old (not a service) -> head 10.0.0.5:7700, node n-00ff00ff: not running" in text
    assert "secret" not in text

    found = json.loads(status("--json"))
    assert not found["installed"]
    box, old = found["by_hand"]
    assert (box["name"], box["node_id"], box["head"], box["running"]["pid"]) == \
        ("box", "n-1a2b3c4d", "10.0.0.5:7700", this_process()["pid"])
    assert (old["name"], old["running"]) == ("old", None)
