"""Findings 6 and 8: what a local user could plant in the shared /tmp. A fixed `/tmp/farm-locks/ray-start.lock`,
opened following links and waited on forever, let a local user make root create a file where a link pointed, or hang
`farm head start` by holding it; a link planted at `/tmp/farm-ray-<node id>` (node ids are public) kept an agent from
starting."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from farm import local
from farm.core.errors import AgentError
from farm.local import RayProcess


class Spawned(Exception):
    """Raised instead of starting Ray: the start got past its lock."""


@pytest.fixture()
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("FARM_STATE_DIR", str(folder))

    def spawn(*args: object, **kwargs: object) -> None:
        raise Spawned()

    monkeypatch.setattr(local, "spawn_detached", spawn)
    return folder


def ray(tmp_path: Path) -> RayProcess:
    token = tmp_path / "ray.token"
    token.write_text("t")
    return RayProcess(["--address", "127.0.0.1:1"], token, tmp_path / "ray.log")


def test_a_lock_held_too_long_is_one_clear_line_not_a_hang(state: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "RAY_START_WAIT_S", 0.5, raising=False)
    monkeypatch.setattr(local.ray_start_lock, "__defaults__", (0.5,), raising=False)
    state.mkdir(mode=0o700)
    with open(state / "ray-start.lock", "w") as held:  # another start of this user's, stuck
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(AgentError) as refused:
            ray(tmp_path).start()
    assert "\n" not in refused.value.message and "starting for over" in refused.value.message


def test_a_link_planted_as_the_lock_is_not_followed(state: Path, tmp_path: Path) -> None:
    state.mkdir(mode=0o700)
    target = tmp_path / "elsewhere" / "created-by-the-start"
    target.parent.mkdir()
    (state / "ray-start.lock").symlink_to(target)
    with pytest.raises(AgentError, match="link"):
        ray(tmp_path).start()
    assert not target.exists()


def test_the_lock_is_in_the_caller_s_state_folder_not_in_tmp(state: Path, tmp_path: Path) -> None:
    with pytest.raises(Spawned):
        ray(tmp_path).start()
    lock = state / "ray-start.lock"
    assert lock.is_file() and not lock.is_symlink() and (lock.stat().st_mode & 0o077) == 0


def test_a_link_planted_at_a_node_s_ray_folder_neither_stops_it_nor_is_followed(tmp_path: Path) -> None:
    from farm import ray_user

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    planted = tmp_path / "farm-ray-n-abc"
    planted.symlink_to(victim)
    folder = ray_user.private_folder(planted, None)
    assert folder.is_dir() and not folder.is_symlink() and (folder.stat().st_mode & 0o777) == 0o700
    assert (victim / "keep").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() != 0, reason="plants a link owned by another user")
def test_a_link_another_user_planted_gets_the_node_a_folder_of_a_random_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from farm import ray_user

    planted = tmp_path / "farm-ray-n-abc"
    planted.symlink_to(tmp_path)
    os.lchown(planted, 54321, 54321)  # another user's, which this (non-root) agent may not remove
    monkeypatch.setattr(os, "geteuid", lambda: 12345)
    folder = ray_user.private_folder(planted, None)
    assert folder != planted and folder.name.startswith("farm-ray-n-abc-") and folder.is_dir()
    assert not folder.is_symlink() and (folder.stat().st_mode & 0o777) == 0o700 and planted.is_symlink()
