"""A state file names its process by pid and start time: a pid that another process has taken since is not the
recorded process, and nothing is stopped or refused on its account."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
from typer.testing import CliRunner

from farm.cli import agent as agent_cli
from farm.cli import head as head_cli
from farm.core.errors import UserError
from farm.local import pid_alive, recorded_alive, this_process, write_json


def test_a_record_names_its_process_by_pid_and_start_time() -> None:
    me = this_process()
    assert recorded_alive(me)
    assert pid_alive(me["pid"], me["pid_started"])
    assert not recorded_alive({**me, "pid_started": me["pid_started"] - 3600})  # the pid, taken over since
    assert not recorded_alive({"pid": me["pid"]})  # an old record without a start time is not trusted
    assert not recorded_alive({**me, "pid_started": "soon"})
    assert not recorded_alive(None)


def test_a_reused_pid_is_neither_stopped_nor_blocks_a_start(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "300"])  # holds the pid a stopped agent and head once had
    try:
        started = psutil.Process(bystander.pid).create_time()
        reused = {"pid": bystander.pid, "pid_started": started - 60.0}
        write_json(tmp_path / "agents" / "box" / "agent.json", {**reused, "name": "box", "state": "ready"})
        write_json(tmp_path / "head.json", {**reused, "address": "127.0.0.1:1"})

        stopped = CliRunner().invoke(agent_cli.app, ["stop", "--state-dir", str(tmp_path)])
        assert isinstance(stopped.exception, UserError) and "no agent running" in stopped.exception.message
        stopped = CliRunner().invoke(head_cli.app, ["stop", "--state-dir", str(tmp_path)])
        assert isinstance(stopped.exception, UserError) and "no head running" in stopped.exception.message
        assert bystander.poll() is None  # alive: the old pid_alive(pid) sent it SIGTERM

        # The real process's record is stopped as before.
        write_json(tmp_path / "agents" / "box" / "agent.json",
                   {"pid": bystander.pid, "pid_started": started, "name": "box", "state": "ready"})
        stopped = CliRunner().invoke(agent_cli.app, ["stop", "--state-dir", str(tmp_path)])
        assert stopped.exit_code == 0, stopped.output
        assert bystander.wait(timeout=10) is not None
    finally:
        bystander.kill()
        bystander.wait()
