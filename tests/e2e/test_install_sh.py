"""agents/install.sh for real: a new virtual environment in a temporary prefix, Farm pip-installed into it from this
repository with its dependencies (not its extras: --no-extras skips torch and the worker, cuda and apple extras, which
would take minutes), in a temporary HOME. The service step runs as `farm agent install --dry-run` (no systemd here)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

CA_HASH = "sha256:" + "ab" * 32
SCRIPT = ROOT / "agents" / "install.sh"
TOKEN = "join-SECRET-0d9e"


@dataclass
class Installed:
    home: Path
    prefix: Path
    first: subprocess.CompletedProcess[str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return install_sh(self.home, "--prefix", str(self.prefix), *args)


def install_sh(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}
    env.pop("FARM_STATE_DIR", None)
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env,
                          check=False)


def snapshot(*folders: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for folder in folders for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("install-sh")
    home = root / "home"
    home.mkdir()
    prefix = root / "prefix" / "venv"
    first = install_sh(home, "--from", str(ROOT), "--prefix", str(prefix), "--no-extras", "--no-service")
    yield Installed(home=home, prefix=prefix, first=first)


def test_installs_farm_into_a_new_environment(installed: Installed) -> None:
    assert installed.first.returncode == 0, installed.first.stderr
    assert f"python3 -m venv {installed.prefix}" in installed.first.stdout
    farm = installed.prefix / "bin" / "farm"
    version = subprocess.run([str(farm), "--help"], capture_output=True, text=True, timeout=120,
                             check=False)
    assert version.returncode == 0 and "agent" in version.stdout
    # The service templates travel with the package (not only in the source tree).
    assert (installed.prefix / "share/farm/systemd/farm-agent.service").is_file()
    assert (installed.prefix / "share/farm/launchd/io.farm.agent.plist").is_file()


def test_second_run_changes_nothing_and_installs_the_service(installed: Installed, tmp_path: Path) -> None:
    assert installed.first.returncode == 0, installed.first.stderr
    token_file = tmp_path / "join.token"
    token_file.write_text(TOKEN + "\n")
    before = snapshot(installed.prefix, installed.home)
    again = installed.run("--from", str(ROOT), "--no-extras", "--head", "10.0.0.5:7700", "--token-file",
                          str(token_file), "--ca-hash", CA_HASH, "--name", "spare", "--user", "--dry-run")
    assert again.returncode == 0, again.stderr
    assert "Farm is installed in" in again.stdout and "pip install" not in again.stdout
    # The installed farm renders the unit from its own shipped templates and runs itself.
    assert (f"ExecStart={installed.prefix}/bin/farm agent start --head 10.0.0.5:7700 --token-file "
            f"{installed.home}/.farm/agents/spare/join.token --name spare") in again.stdout
    assert f"--ca-hash {CA_HASH}" in again.stdout  # the agent pins the head's CA at its first start
    assert TOKEN not in again.stdout + again.stderr
    assert snapshot(installed.prefix, installed.home) == before


def test_dry_run_creates_nothing(tmp_path: Path) -> None:
    result = install_sh(tmp_path, "--prefix", str(tmp_path / "venv"), "--no-extras", "--head", "h:7700",
                        "--token", TOKEN, "--insecure", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"+ python3 -m venv {tmp_path / 'venv'}" in result.stdout
    assert "pip install" in result.stdout and f"{tmp_path / 'venv'}/bin/farm agent install" in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--head HOST:PORT is required"),
        (("--head", "nocolon", "--token", "t"), "expected HOST:PORT"),
        (("--head", "h:1"), "--token or --token-file is required"),
        (("--head", "h:1", "--token-file", "/nonexistent"), "not a readable file"),
        (("--head", "h:1", "--token", "t"), "--ca-hash (from the join line) or --insecure is required"),
        (("--no-service", "--cpus", "two"), "expected a positive whole number"),
        (("--no-service", "--python", "no-such-python"), "no-such-python not found"),
        (("--no-service", "--python", "false"), "Farm needs Python 3.11 or newer"),
        (("--no-service", "--from", "/"), "no pyproject.toml there"),
        (("--bogus",), "unknown option --bogus"),
    ],
)
def test_clear_errors(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = install_sh(tmp_path, "--prefix", str(tmp_path / "venv"), *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("install.sh: error: ") and message in lines[0], result.stderr
    assert not (tmp_path / "venv").exists()
