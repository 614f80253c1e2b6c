"""Finding 14: the head's Ray driver (the head process itself, root) wrote its log (`python-core-driver-*.log`) into
its Ray session's logs folder, which belongs to farm-ray, the user the head's Ray runs as. Ray's log rotation closes
that file and opens it again by name (spdlog, truncating): farm-ray, or job code running as farm-ray on the head's
machine, could swap a link in at that name and have the root head truncate and write any file of the machine. The
driver now logs to the head's own log (in the head's 0700 state folder) and opens nothing in a folder farm-ray owns.

A real head started as root, its Ray as farm-ray. Run as root only."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from farm import ray_user
from farm.client import find_head
from farm.head.settings import HeadSettings
from farm.local import read_json
from tests.conftest import farm
from tests.integration.test_ray_user import reachable_python  # noqa: F401 (a fixture)
from tests.ports import head_ports

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                                   reason="Ray runs as another user only for a head run as root")]


@pytest.fixture(scope="module")
def head_state(tmp_path_factory: pytest.TempPathFactory,
               reachable_python: ray_user.pwd.struct_passwd) -> Iterator[Path]:  # noqa: F811
    state = tmp_path_factory.mktemp("ray-logs-head")
    started = farm("head", "start", "--host", "127.0.0.1", *head_ports(), "--state-dir", str(state), "--detach",
                   env={"FARM_RAY_USER": ray_user.DEFAULT})
    assert started.returncode == 0, started.stderr
    try:
        find_head(state_dir=state)
        yield state
    finally:
        farm("head", "stop", "--state-dir", str(state))


def test_the_head_s_driver_writes_nothing_in_the_folder_farm_ray_owns(head_state: Path) -> None:
    ray_folder = HeadSettings(state_dir=head_state).ray_temp_dir
    assert ray_folder.stat().st_uid == ray_user.ensure(ray_user.DEFAULT).pw_uid  # the Ray node's, not the head's
    head = psutil.Process(int((read_json(head_state / "head.json") or {})["pid"]))
    opened = [f.path for f in head.open_files() if Path(f.path).is_relative_to(ray_folder)]
    assert opened == [], opened
    heads_own = [str(p) for p in ray_folder.rglob("*") if not p.is_symlink() and p.lstat().st_uid == head.uids().effective]
    assert heads_own == [], heads_own


def test_the_driver_s_log_is_in_the_head_s_own_log(head_state: Path) -> None:
    """What the driver logs is not lost: it goes where the head's own lines go (0600, in the 0700 state folder)."""
    log = head_state / "head.log"
    assert log.exists() and (log.stat().st_mode & 0o077) == 0
