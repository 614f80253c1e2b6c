"""The agent's service files: the systemd unit checked by systemd's own `systemd-analyze verify`, the launchd plist
read back with plistlib, and the install/uninstall plans carried out against a recording service manager."""

from __future__ import annotations

import os
import plistlib
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from farm_agent.daemon import service
from farm_agent.daemon.service import AgentService, Plan

from farm.cli.agent import _join_token
from farm.core.errors import UserError
from farm.local import this_process, write_json

TOKEN = "join-SECRET-7f3a"


@pytest.fixture()
def farm_exe(tmp_path: Path) -> Path:
    """An executable to stand for the environment's farm: systemd-analyze checks that ExecStart's program exists."""
    exe = tmp_path / "venv dir" / "bin" / "farm"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


def agent(farm_exe: Path, *, user_scope: bool = False) -> AgentService:
    """An agent whose paths need systemd's quoting: a space in the name, a % in the state folder."""
    return AgentService(farm=farm_exe, head="10.0.0.5:7700", name="box 1", state_dir=farm_exe.parents[2] / "state 100%",
                        cpus=4, user_scope=user_scope, run_as=None if user_scope else "alice",
                        ca_hash="sha256:" + "ab" * 32)


def verify(unit_text: str, folder: Path, user_scope: bool) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` on the unit; it exits 0 on unknown keys or bad values but says so on stderr."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (apt-get install systemd)")
    folder.mkdir(exist_ok=True)
    path = folder / service.SYSTEMD_UNIT
    path.write_text(unit_text)
    runtime = folder / "runtime"  # a user manager needs a runtime folder, which a test process has none of
    runtime.mkdir(mode=0o700, exist_ok=True)
    return subprocess.run(["systemd-analyze", *(["--user"] if user_scope else []), "verify", str(path)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})


@pytest.mark.parametrize("user_scope", [False, True], ids=["system", "user"])
def test_systemd_unit_passes_systemd_analyze(farm_exe: Path, tmp_path: Path, user_scope: bool) -> None:
    svc = agent(farm_exe, user_scope=user_scope)
    unit = service.render_systemd_unit(svc)
    checked = verify(unit, tmp_path / "unit", user_scope)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    lines = unit.splitlines()
    assert "Restart=on-failure" in lines and "After=network-online.target" in lines
    assert "KillMode=mixed" in lines and f"TimeoutStopSec={service.STOP_TIMEOUT_S}" in lines
    assert "Delegate=yes" in lines  # the agent makes its Ray node's cgroup under the unit's (farm/node_group.py)
    assert ("User=alice" in lines) is not user_scope
    assert f"WantedBy={'default.target' if user_scope else 'multi-user.target'}" in lines
    # The argument list survives systemd's quoting (a space, a %), and it runs the agent in the foreground.
    installed = tmp_path / "unit" / service.SYSTEMD_UNIT
    assert service.installed_command(installed) == svc.command()
    assert svc.command()[:3] == [str(farm_exe), "agent", "start"] and "--detach" not in svc.command()
    assert service.option(svc.command(), "--token-file") == str(svc.token_file)
    assert service.option(svc.command(), "--ca-hash") == svc.ca_hash  # the agent pins the head's CA with it
    assert TOKEN not in unit and "--token " not in unit


def test_the_ray_user_asked_at_install_is_in_the_service_s_command(farm_exe: Path) -> None:
    svc = AgentService(farm=farm_exe, head="10.0.0.5:7700", name="box", state_dir=farm_exe.parent, ray_user="jobs")
    assert svc.command()[-2:] == ["--ray-user", "jobs"]
    assert "--ray-user" not in agent(farm_exe).command()  # not asked: the agent's own default (farm-ray as root)


def test_systemd_analyze_catches_a_broken_unit(farm_exe: Path, tmp_path: Path) -> None:
    """The check above can fail: a bad value is reported."""
    unit = service.render_systemd_unit(agent(farm_exe)).replace("Restart=on-failure", "Restart=sometimes")
    assert "restart specifier" in verify(unit, tmp_path / "broken", user_scope=False).stderr


@pytest.mark.parametrize("user_scope", [False, True], ids=["daemon", "agent"])
def test_launchd_plist(farm_exe: Path, tmp_path: Path, user_scope: bool) -> None:
    svc = agent(farm_exe, user_scope=user_scope)
    data = service.render_launchd_plist(svc)
    job = plistlib.loads(data)
    assert job["Label"] == service.LAUNCHD_LABEL
    assert job["ProgramArguments"] == svc.command()
    assert job["RunAtLoad"] is True and job["KeepAlive"] == {"SuccessfulExit": False}
    assert job["StandardOutPath"] == job["StandardErrorPath"] == str(svc.log_path)
    assert job["ExitTimeOut"] == service.STOP_TIMEOUT_S
    assert job.get("UserName") == (None if user_scope else "alice")
    assert TOKEN.encode() not in data
    (tmp_path / "io.farm.agent.plist").write_bytes(data)
    assert service.installed_command(tmp_path / "io.farm.agent.plist") == svc.command()


def test_service_paths(tmp_path: Path) -> None:
    assert service.service_path("linux", False, tmp_path) == Path("/etc/systemd/system/farm-agent.service")
    assert service.service_path("linux", True, tmp_path) == tmp_path / ".config/systemd/user/farm-agent.service"
    assert service.service_path("darwin", True, tmp_path) == tmp_path / "Library/LaunchAgents/io.farm.agent.plist"
    assert service.service_path("darwin", False, tmp_path) == Path("/Library/LaunchDaemons/io.farm.agent.plist")


def test_plans_name_the_service_manager_commands(farm_exe: Path, tmp_path: Path) -> None:
    system = service.install_plan(agent(farm_exe), TOKEN, "linux", tmp_path, 501)
    assert [c.argv for c in system.commands] == [
        ["systemctl", "daemon-reload"], ["systemctl", "enable", "farm-agent.service"],
        ["systemctl", "restart", "farm-agent.service"]]
    svc = agent(farm_exe)  # a system service run as alice: root hands her the agent's folders and token
    assert system.owner == "alice" and system.owned[-2:] == [svc.agent_dir, svc.token_file]
    mac = service.install_plan(agent(farm_exe, user_scope=True), TOKEN, "darwin", tmp_path, 501)
    assert mac.owner is None and mac.owned == []
    assert [c.argv for c in mac.commands] == [
        ["launchctl", "bootout", "gui/501/io.farm.agent"],
        ["launchctl", "bootstrap", "gui/501", str(tmp_path / "Library/LaunchAgents/io.farm.agent.plist")]]
    assert not mac.commands[0].check  # booting out a job that is not loaded is no error
    printed = "\n".join(service.describe(system))
    assert TOKEN not in printed and "(the join token, not shown)" in printed
    assert "ExecStart=" in printed and "would run: systemctl restart farm-agent.service" in printed


class Recorder:
    """A service manager that records what it is asked and answers like a running systemd."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        answer = {"is-enabled": "enabled\n", "is-active": "active\n"}.get(argv[-2], "")
        return subprocess.CompletedProcess(argv, 0, answer, "")


def test_install_status_uninstall(farm_exe: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    svc = agent(farm_exe, user_scope=True)
    manager = Recorder()
    plan = service.install_plan(svc, TOKEN + "\n", "linux", home, os.getuid())
    assert service.apply(plan, manager) == []
    unit = service.service_path("linux", True, home)
    assert svc.token_file.read_text() == TOKEN + "\n"
    assert stat.S_IMODE(svc.token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert ["systemctl", "--user", "restart", "farm-agent.service"] in manager.calls

    before = (unit.read_bytes(), svc.token_file.read_bytes())  # installing again writes the same files
    service.apply(service.install_plan(svc, TOKEN, "linux", home, os.getuid()), manager)
    assert (unit.read_bytes(), svc.token_file.read_bytes()) == before

    (svc.agent_dir / "node.json").write_text('{"node_id": "n-1"}')
    write_json(svc.agent_dir / "agent.json", {**this_process(), "state": "ready", "node_id": "n-1"})
    found = service.query("linux", True, home, os.getuid(), manager)
    assert found["installed"] and found["enabled"] and found["active"]
    assert (found["head"], found["name"], found["cpus"], found["node_id"]) == ("10.0.0.5:7700", "box 1", "4", "n-1")
    assert found["agent"]["state"] == "ready"

    manager.calls.clear()
    service.apply(service.uninstall_plan("linux", True, home, os.getuid()), manager)
    assert manager.calls == [["systemctl", "--user", "disable", "--now", "farm-agent.service"],
                             ["systemctl", "--user", "daemon-reload"]]
    assert not unit.exists() and not svc.token_file.exists()
    assert (svc.agent_dir / "node.json").exists()  # the node keeps its identity for a later install
    assert service.query("linux", True, home, os.getuid(), manager)["installed"] is False


def test_a_failing_command_stops_the_install(farm_exe: Path, tmp_path: Path) -> None:
    def refuses(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "Failed to connect to bus: No medium found\n")

    plan = service.install_plan(agent(farm_exe, user_scope=True), TOKEN, "linux", tmp_path, os.getuid())
    with pytest.raises(RuntimeError, match="systemctl --user daemon-reload failed: Failed to connect to bus"):
        service.apply(plan, refuses)
    assert service.apply(Plan(before=[service.Command(["launchctl", "bootout", "x"], check=False)]), refuses) == [
        "launchctl bootout x: Failed to connect to bus: No medium found"]


def test_join_token_from_exactly_one_place(tmp_path: Path) -> None:
    token_file = tmp_path / "join.token"
    token_file.write_text(f"  {TOKEN}\n")
    assert _join_token(None, token_file) == TOKEN
    assert _join_token(TOKEN, None) == TOKEN
    for token, path in ((None, None), (TOKEN, token_file)):
        with pytest.raises(UserError, match="exactly one of --token and --token-file"):
            _join_token(token, path)
    token_file.write_text("\n")
    with pytest.raises(UserError, match="is empty"):
        _join_token(None, token_file)
    with pytest.raises(UserError, match="No such file"):
        _join_token(None, tmp_path / "missing")
