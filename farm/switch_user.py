"""Run a command as another user (this process being root) without forking this process.

`subprocess` switches the user in the child between fork and exec; to do so it must fork() rather than vfork(), and
fork() runs every pthread_atfork handler the libraries loaded here registered. In an agent or head whose gRPC
threads are live, such a handler aborted the child at random before it exec'd: a worker or `ray start` died with
SIGABRT or SIGSEGV, writing nothing (a quarter of `farm demo` runs as farm-ray failed so). So the switch happens in a
small Python of its own instead: this process starts it as itself (vfork, no handlers run), and it drops to the user
(no supplementary groups, then the group, then the user), optionally asks for SIGTERM at its parent's death (a change
of user clears that request, so it comes after), and execs the command."""

from __future__ import annotations

import pwd
import subprocess
import sys
from collections.abc import Sequence

# Runs as `python -I -S -c SWITCH UID GID DEATH_SIGNAL PROGRAM ARGS...` (sys.argv[0] is "-c"; UID -1: no switch). No
# site, no imports but the standard library's: nothing of the target user's can load into a process still root.
SWITCH = """
import os, sys
uid, gid, death = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
parent = os.getppid()
if uid >= 0:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        sys.exit("farm: could not switch user")
if death:
    import ctypes, signal
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request: nobody is left to ask for this
        sys.exit(0)
os.execvp(sys.argv[4], sys.argv[4:])
"""

# Whether `user` may pass through each folder (and list it, where its path comes with a leading "+"), asked of the
# kernel as that user: prints the index of the first it may not (-1: all open). `python -I -S -c CHECK UID GID
# FOLDER...`.
CHECK = """
import os, sys
os.setgroups([])
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[1]))
def open_(folder):
    return os.access(folder[1:], os.R_OK | os.X_OK) if folder[0] == "+" else os.access(folder, os.X_OK)
print(next((i for i, folder in enumerate(sys.argv[3:]) if not open_(folder)), -1))
"""


def command_as(user: pwd.struct_passwd | None, args: Sequence[str], death_signal: bool = False) -> list[str]:
    """`args` to be started by this process (root, where `user` is given) so that they run as `user`, and with
    `death_signal` (Linux) get SIGTERM when the thread that starts them dies; unchanged where neither applies."""
    death_signal = death_signal and sys.platform == "linux"
    if user is None and not death_signal:
        return list(args)
    uid, gid = (user.pw_uid, user.pw_gid) if user is not None else (-1, -1)
    return [sys.executable, "-I", "-S", "-c", SWITCH, str(uid), str(gid), "1" if death_signal else "0", *args]


def first_closed_as(user: pwd.struct_passwd, folders: Sequence[str], listed: Sequence[str] = ()) -> int | None:
    """The index of the first of `folders` that `user` may not pass through (nor list, for those also in `listed`),
    as the kernel answers a process that became that user (mode bits, ACLs, whatever else decides); -1 when all are
    open; None when it could not ask."""
    asked = [f"+{folder}" if folder in listed else folder for folder in folders]
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", CHECK, str(user.pw_uid), str(user.pw_gid),
                               *asked], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return int(done.stdout.strip()) if done.returncode == 0 else None
    except ValueError:
        return None
