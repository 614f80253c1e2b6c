"""Starting a process as another user never forks the starting process (farm/switch_user.py): a fork runs the
pthread_atfork handlers that the libraries loaded there registered, and in a threaded agent one of them aborted the
child before it became a worker (a quarter of `farm demo` runs as farm-ray failed with SIGABRT or SIGSEGV)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="switching users needs root")

# A process whose every fork() aborts the child, as the agent's did at random: an atfork child handler that is libc's
# abort. Then it starts, as farm-ray, a worker the agent's way, a detached process, and asks what farm-ray may reach.
HOSTILE_FORKS = """
import asyncio, ctypes, pwd, subprocess, sys
from pathlib import Path
libc = ctypes.CDLL(None)
assert libc.__register_atfork(None, None, ctypes.cast(libc.abort, ctypes.c_void_p), None) == 0
from farm import ray_user
from farm.local import spawn_detached
from farm.switch_user import command_as, first_closed_as
user = ray_user.ensure(ray_user.DEFAULT)
out = Path(sys.argv[1])

async def worker():
    proc = await asyncio.create_subprocess_exec(*command_as(user, ["/usr/bin/id", "-u"]), stdout=subprocess.PIPE,
                                                start_new_session=True)
    said, _ = await proc.communicate()
    return proc.returncode, said.decode().strip()

print("worker", *asyncio.run(worker()))
detached = spawn_detached(["/usr/bin/id", "-u"], out / "detached.log", user=user, die_with_parent=True)
print("detached", detached.wait(), (out / "detached.log").read_text().strip())
print("closed", first_closed_as(user, ["/", str(out / "private")]))
"""


def test_a_process_whose_forks_crash_still_starts_work_as_another_user(tmp_path: Path) -> None:
    from farm import ray_user

    user = ray_user.ensure(ray_user.DEFAULT)
    (tmp_path / "private").mkdir(mode=0o700)
    tmp_path.chmod(0o755)
    done = subprocess.run([sys.executable, "-c", HOSTILE_FORKS, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"worker 0 {user.pw_uid}", f"detached 0 {user.pw_uid}", "closed 1"]
