"""What a head or agent killed outright leaves of its Ray node is found again by its recorded pids and start times,
and ended at the next start: those processes, and never a process that merely has a recorded pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from farm.local import clear_left_behind, record_session, wait_for, write_json

# A session leader with a child, as `ray start` with its GCS and raylet.
FAMILY = [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"]


def test_the_session_a_killed_owner_left_is_ended_and_nothing_else(tmp_path: Path) -> None:
    leader = subprocess.Popen(FAMILY, start_new_session=True)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        assert wait_for(lambda: len(psutil.Process(leader.pid).children()) == 1, 10)
        (child,) = psutil.Process(leader.pid).children()
        record = tmp_path / "ray-head.json"
        record_session(record, leader.pid)
        os.kill(leader.pid, signal.SIGKILL)  # the leader dies; its child lives on in the session, as Ray's did
        leader.wait()
        assert child.is_running()

        # A record naming a live process by pid, with another start time (a reused pid), ends nothing.
        write_json(tmp_path / "stale.json", {"session": bystander.pid, "processes": [[bystander.pid, 1.0]]})
        assert clear_left_behind(tmp_path / "stale.json") == []
        assert bystander.poll() is None

        assert clear_left_behind(record) == [child.pid]
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        assert not record.exists()
        assert clear_left_behind(record) == []  # nothing recorded: nothing to do
    finally:
        bystander.kill()
        for proc in psutil.process_iter():
            try:
                if proc.pid != os.getpid() and os.getsid(proc.pid) == leader.pid:
                    proc.kill()
            except (OSError, psutil.Error):
                continue
