"""Issue 31, item 1: as root, with Python and the venv under a private (0700) home, as pyenv or conda put them on
many GPU machines, README's commands failed after the demo: `farm head start` and `farm agent start` exited 2,
since farm-ray, which runs job code, cannot reach them. scripts/setup now lets farm-ray alone pass through those
folders (`python -m farm.ray_user`: an ACL, execute only); then README's commands run a job whose code runs as
farm-ray, not root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm import ray_user
from farm.local import free_port, read_json
from tests.conftest import ROOT
from tests.ports import head_ports

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="root on Linux only"),
    pytest.mark.skipif(shutil.which("setfacl") is None, reason="no setfacl (Debian: apt-get install acl)"),
]


@pytest.fixture()
def private_home(tmp_path: Path) -> Iterator[Path]:
    """A 0700 home holding a venv with Farm (this checkout) and its packages, as `scripts/setup` makes there. Every
    folder farm-ray was let through during the test is closed to it again afterwards."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    venv = home / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # type: ignore[attr-defined]
    site = venv / Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    (site / "_farm.pth").write_text("\n".join([sysconfig.get_path("purelib"), str(ROOT), str(ROOT / "agents")]))
    (venv / "bin" / "farm").write_text(f"#!{venv / 'bin' / 'python'}\nfrom farm.cli.main import main\nmain()\n")
    (venv / "bin" / "farm").chmod(0o755)
    name = ray_user.ensure(ray_user.DEFAULT).pw_name
    on_the_way = {f for target in (venv, Path(sys._base_executable).resolve(), ROOT)  # type: ignore[attr-defined]
                  for f in (target, *target.parents)}
    before = {folder: _acl(folder) for folder in on_the_way}
    try:
        yield venv
    finally:
        for folder, acl in before.items():
            if f"user:{name}:" in _acl(folder) and f"user:{name}:" not in acl:
                # Back as it was: with no extended ACL at all where it had none (-x alone leaves a mask behind).
                had_extended = any(line.startswith("mask:") for line in acl.splitlines())
                undo = ["-x", f"u:{name}"] if had_extended else ["-b"]
                subprocess.run(["setfacl", *undo, str(folder)], check=False)


def _acl(folder: Path) -> str:
    return subprocess.run(["getfacl", "-cp", str(folder)], capture_output=True, text=True, check=False).stdout


def test_readme_s_commands_run_a_job_as_farm_ray_from_a_private_home(private_home: Path, tmp_path: Path) -> None:
    venv = private_home
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", FARM_STATE_DIR=str(tmp_path / "state"),
               FARM_CONFIG=str(tmp_path / "config.toml"))

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "farm"), *args], capture_output=True, text=True, timeout=300,
                              cwd=ROOT, env={**env, **extra}, stdin=subprocess.DEVNULL)

    user = ray_user.ensure(ray_user.DEFAULT)
    assert ray_user.first_closed(user, [venv]) is not None  # the case at hand: farm-ray is shut out of the venv
    refused = run("head", "start", "--port", str(free_port()), "--detach")
    assert refused.returncode == 2 and "./scripts/setup" in refused.stderr, refused.stderr  # and it says the fix

    granted = subprocess.run([str(venv / "bin" / "python"), "-m", "farm.ray_user"], capture_output=True, text=True,
                             env=env, check=False)  # what scripts/setup runs as root
    assert granted.returncode == 0 and "may now pass through" in granted.stdout, granted.stderr
    assert ray_user.first_closed(user, [ROOT / "farm", ROOT / "agents" / "farm_agent"]) is None
    assert venv.parent.stat().st_mode & 0o007 == 0  # still closed to everyone else (the group bits show the ACL mask)

    state = tmp_path / "state"
    spec = tmp_path / "who.yaml"
    spec.write_text(json.dumps({"name": "who", "model": "toyjob:whoami", "dataset": "toyjob:numbers", "shards": 1,
                                "batch_size": 8, "backends": ["cpu"], "output": str(tmp_path / "out")}))
    try:
        started = run("head", "start", "--host", "127.0.0.1", *head_ports(), "--detach")
        assert started.returncode == 0, started.stderr
        head = read_json(state / "head.json") or {}
        joined = run("agent", "start", "--head", head["address"], "--ca-hash", head["ca_hash"], "--name", "lent",
                     "--cpus", "1", "--max-foreign-cpu", "100", "--detach", FARM_JOIN_TOKEN=head["join_token"])
        assert joined.returncode == 0, joined.stderr
        done = run("submit", str(spec), "--wait", "--json", "--no-check", "--workdir", str(ROOT / "tests/fixtures/jobs"))
        assert done.returncode == 0, done.stderr
        job = json.loads(done.stdout)
        assert job["state"] == "succeeded", job.get("error")
        assert f"job code runs as uid {user.pw_uid}\n" in run("logs", job["id"]).stdout + "\n"
    finally:
        run("agent", "stop")
        run("head", "stop")
