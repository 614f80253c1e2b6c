"""`farm agent install|status|uninstall` through the real command line, in a temporary HOME. The service manager is
a recording stand-in on PATH (this machine runs no systemd): what is tested is what Farm writes and asks for."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.conftest import Cluster, farm

TOKEN = "join-SECRET-51c2"
STUB = """#!/bin/sh
# Records each call; answers `is-enabled`/`is-active` like a running service.
echo "$(basename "$0") $*" >> "{log}"
case "$*" in *is-enabled*) echo enabled ;; *is-active*) echo active ;; esac
"""


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture()
def managed(tmp_path: Path, home: Path) -> dict[str, str]:
    """The environment of a user whose service manager is the recording stand-in."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name in ("systemctl", "loginctl"):
        (stubs / name).write_text(STUB.format(log=tmp_path / "calls.log"))
        (stubs / name).chmod(0o755)
    return {"HOME": str(home), "PATH": f"{stubs}:{os.environ['PATH']}", "FARM_STATE_DIR": str(home / ".farm")}


CA_HASH = "sha256:" + "cd" * 32

def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_dry_run_prints_the_unit_and_changes_nothing(home: Path) -> None:
    result = farm("agent", "install", "--head", "10.0.0.5:7700", "--token", TOKEN, "--name", "box1", "--user",
                  "--ca-hash", CA_HASH, "--dry-run", env={"HOME": str(home), "FARM_STATE_DIR": str(home / ".farm")})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"would write {home}/.config/systemd/user/farm-agent.service (mode 0644)" in out
    assert f"would write {home}/.farm/agents/box1/join.token (mode 0600)" in out
    farm_exe = Path(sys.executable).parent / "farm"
    assert (f"ExecStart={farm_exe} agent start --head 10.0.0.5:7700 --token-file {home}/.farm/agents/box1/join.token"
            f" --name box1 --state-dir {home}/.farm --ca-hash {CA_HASH}") in out
    assert "would run: systemctl --user enable farm-agent.service" in out
    assert TOKEN not in out
    assert list(home.iterdir()) == []


def test_a_system_service_runs_the_agent_as_root_and_its_ray_as_the_ray_user(home: Path) -> None:
    """No User= line (the agent as root, so that it can run its Ray, and job code, as another user), and the Ray
    user asked for is in the agent's command."""
    env = {"HOME": str(home), "FARM_STATE_DIR": str(home / ".farm")}
    result = farm("agent", "install", "--head", "10.0.0.5:7700", "--token", TOKEN, "--name", "box1", "--ca-hash",
                  CA_HASH, "--ray-user", "jobs", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert "User=" not in result.stdout and "Delegate=yes" in result.stdout
    assert f"--name box1 --state-dir {home}/.farm --ca-hash {CA_HASH} --ray-user jobs\n" in result.stdout
    both = farm("agent", "install", "--head", "h:7700", "--token", TOKEN, "--user", "--insecure", "--run-as", "x",
                "--dry-run", env=env)
    assert both.returncode == 2 and "--run-as is for a system service" in both.stderr


def test_install_status_uninstall(tmp_path: Path, home: Path, managed: dict[str, str]) -> None:
    token_file = tmp_path / "given.token"
    token_file.write_text(TOKEN + "\n")
    install = ("agent", "install", "--head", "10.0.0.5:7700", "--token-file", str(token_file), "--name", "box1",
               "--cpus", "2", "--user", "--insecure")
    result = farm(*install, env=managed)
    assert result.returncode == 0, result.stderr
    unit = home / ".config/systemd/user/farm-agent.service"
    secret = home / ".farm/agents/box1/join.token"
    assert secret.read_text().strip() == TOKEN and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert TOKEN not in unit.read_text() and f"--token-file {secret}" in unit.read_text()
    assert calls(tmp_path) == ["systemctl --user daemon-reload", "systemctl --user enable farm-agent.service",
                               "systemctl --user restart farm-agent.service", f"loginctl enable-linger {_me()}"]

    written = unit.read_bytes(), secret.read_bytes()
    assert farm(*install, env=managed).returncode == 0  # twice: the same files
    assert (unit.read_bytes(), secret.read_bytes()) == written

    status = farm("agent", "status", "--json", env=managed)
    assert status.returncode == 0, status.stderr
    found = json.loads(status.stdout)
    assert found["installed"] and found["enabled"] and found["active"]
    assert (found["head"], found["name"], found["cpus"], found["agent"]) == ("10.0.0.5:7700", "box1", "2", None)
    text = farm("agent", "status", env=managed).stdout
    assert "enabled, active" in text and "agent box1 -> head 10.0.0.5:7700" in text and "not running" in text

    result = farm("agent", "uninstall", "--user", env=managed)
    assert result.returncode == 0, result.stderr
    assert not unit.exists() and not secret.exists()
    assert calls(tmp_path)[-2:] == ["systemctl --user disable --now farm-agent.service",
                                    "systemctl --user daemon-reload"]
    again = farm("agent", "uninstall", "--user", env=managed)
    assert again.returncode == 2 and "no agent service installed" in again.stderr
    assert "not installed" in farm("agent", "status", "--user", env=managed).stdout


def test_service_manager_failure_is_one_line(tmp_path: Path, home: Path, managed: dict[str, str]) -> None:
    (tmp_path / "stubs" / "systemctl").write_text("#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\n"
                                                  "exit 1\n")
    result = farm("agent", "install", "--head", "h:7700", "--token", TOKEN, "--user", "--insecure", env=managed)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: systemctl --user daemon-reload failed: Failed to connect to bus: No medium found"]


def test_start_refuses_two_tokens_or_none(tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    token_file.write_text(TOKEN)
    for extra in ((), ("--token", TOKEN, "--token-file", str(token_file))):
        result = farm("agent", "start", "--head", "127.0.0.1:1", *extra, env={"FARM_STATE_DIR": str(tmp_path)})
        assert result.returncode == 2 and "exactly one of --token and --token-file" in result.stderr


@pytest.mark.slow
def test_start_reads_the_token_file(cluster: Cluster, tmp_path: Path) -> None:
    """The file's token is what the agent presents: a wrong one is refused by the real head."""
    token_file = tmp_path / "join.token"
    token_file.write_text("not-the-token\n")
    result = cluster.farm("agent", "start", "--head", cluster.head.address, "--token-file", str(token_file),
                          "--name", "token-file-agent", "--state-dir", str(tmp_path), "--ca-hash", cluster.head.ca_hash,
                          timeout=300)
    assert result.returncode == 2, result.stderr
    assert "invalid join token" in result.stderr


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
