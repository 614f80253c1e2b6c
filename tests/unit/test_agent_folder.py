"""The agent's folder holds its join token, node key and node token: 0700 and the agent's own, or the agent does
not start (job code runs as another user, who must not read it, nor own it and swap what is in it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from farm_agent.daemon.main import private_state_dir

from farm.core.errors import UserError


def test_the_agent_s_folder_is_made_private(tmp_path: Path) -> None:
    folder = tmp_path / "agents" / "box"
    folder.mkdir(parents=True, mode=0o755)
    private_state_dir(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.geteuid()
    private_state_dir(tmp_path / "new" / "box")
    assert stat.S_IMODE((tmp_path / "new" / "box").stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "box"
    folder.mkdir()
    os.chown(folder, 65534, 65534)  # nobody
    with pytest.raises(UserError, match="belongs to uid 65534, not to this agent's user"):
        private_state_dir(folder)
