"""The environment Farm starts its Ray processes in (farm.local.ray_env), as a Ray worker's C library sees it."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from farm.local import ray_env

# Eight threads that each allocate at once, then the number of malloc arenas the process has (glibc's malloc_info).
ARENAS = """
import ctypes, sys, threading
libc = ctypes.CDLL(None)
libc.malloc.restype = libc.fopen.restype = ctypes.c_void_p
barrier = threading.Barrier(8)
def work():
    block = libc.malloc(1 << 16)  # a thread's first malloc takes an arena of its own, while there may be more
    barrier.wait()
    libc.free(ctypes.c_void_p(block))
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
out = libc.fopen(sys.argv[1].encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(out))
libc.fclose(ctypes.c_void_p(out))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_a_ray_worker_s_threads_share_two_malloc_arenas(tmp_path: Path) -> None:
    """Each arena keeps the free memory its threads left: with glibc's 8 a core, a worker's peak grew with the rows
    it had run (benchmark 1)."""
    info = tmp_path / "malloc.xml"
    subprocess.run([sys.executable, "-c", ARENAS, str(info)], env=ray_env(tmp_path / "token"), check=True,
                   timeout=60)
    assert info.read_text().count("<heap nr=") <= 2
