"""A job's pip requirements on a node: installed once per node and distinct set into a cache folder of their own, then
put on the import path of the job's worker processes.

Why not Ray's runtime_env `pip`: in a virtual environment (how Farm is installed everywhere) Ray clones the whole
environment for each distinct set — torch and all, gigabytes per set. Here pip installs into a prefix of its own
and sees the node's environment as installed, so a requirement that torch or numpy already satisfies is not
installed again and only what is new lands in the cache (seconds and megabytes). The cost: a requirement cannot
replace a package the worker has already imported (torch, numpy); README says so.

The head passes the set in the worker's environment (REQUIREMENTS_VAR, through the runtime_env's env_vars: Ray gives
each distinct runtime_env worker processes of their own, so jobs never share one).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from farm.core.errors import FarmError
from farm.core.ids import NODE_ID_VAR
from farm.core.tasks import REQUIREMENTS_VAR

CACHE_VAR = "FARM_REQUIREMENTS_CACHE"  # the node's cache folder, from the agent's environment (jobs cannot set it)
INSTALL_TIMEOUT_S = 900
COMPLETE = ".complete"  # written last: a folder without it is an install that did not finish


class RequirementsError(FarmError):
    """pip could not install a job's requirements on this node."""


def cache_root() -> Path:
    if os.environ.get(CACHE_VAR):
        return Path(os.environ[CACHE_VAR])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "farm" / "requirements"


def cache_key(requirements: list[str], find_links: str | None) -> str:
    """What an installed set depends on: the requirements, where they come from, and the Python they were built for."""
    described = json.dumps([sorted(requirements), find_links, sys.version, sys.prefix, platform.machine()])
    return hashlib.sha256(described.encode()).hexdigest()[:24]


def prepare_from_environment() -> None:
    """The job's requirements (REQUIREMENTS_VAR) installed and importable in this worker; nothing when it has none."""
    described = os.environ.get(REQUIREMENTS_VAR)
    if not described:
        return
    wanted = json.loads(described)
    folder = ensure_installed(list(wanted["requirements"]), wanted.get("find_links"))
    add_to_path(folder)


def ensure_installed(requirements: list[str], find_links: str | None, root: Path | None = None) -> Path:
    """The site-packages folder holding `requirements`, installed now unless this node did it before."""
    prefix = (root or cache_root()) / cache_key(requirements, find_links)
    if (prefix / COMPLETE).exists():
        print(f"requirements: {len(requirements)} from this node's cache ({prefix.name})")
        return _site_packages(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.parent / f"{prefix.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install per set at a time: other workers wait, then find it done
        if not (prefix / COMPLETE).exists():
            _install(requirements, find_links, prefix)
        else:
            print(f"requirements: {len(requirements)} from this node's cache ({prefix.name})")
    return _site_packages(prefix)


def _install(requirements: list[str], find_links: str | None, prefix: Path) -> None:
    began = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.", dir=prefix.parent))
    sources = ["--no-index", "--find-links", find_links] if find_links else []
    command = [sys.executable, "-m", "pip", "install", "--prefix", str(staging), "--disable-pip-version-check",
               "--no-input", "--no-warn-script-location", *sources, "--", *requirements]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                              env={**os.environ, "PIP_NO_INPUT": "1"})
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        raise RequirementsError(f"installing the job's requirements on {_node()} took over {INSTALL_TIMEOUT_S} s"
                                ) from None
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        print(done.stdout + done.stderr)  # all of pip's words, in the shard's log
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
        reason = errors[-1].removeprefix("ERROR: ").strip() if errors else f"pip exited with {done.returncode}"
        raise RequirementsError(f"pip could not install the job's requirements on {_node()}: {reason}")
    (staging / COMPLETE).write_text(json.dumps({"requirements": requirements, "find_links": find_links}))
    shutil.rmtree(prefix, ignore_errors=True)
    os.replace(staging, prefix)
    print(f"requirements: {len(requirements)} installed on {_node()} in {time.monotonic() - began:.1f} s "
          f"({prefix.name})")


def _site_packages(prefix: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))


def add_to_path(folder: Path) -> None:
    """First on the import path (ahead of the node's own packages), its .pth files read."""
    if str(folder) in sys.path:
        return
    site.addsitedir(str(folder))  # appends it and what its .pth files name
    sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))


def _node() -> str:
    """The node as the farm knows it (its agent names it to its workers: NODE_ID_VAR) and its host."""
    node = os.environ.get(NODE_ID_VAR)
    return f"node {node} ({platform.node()})" if node else platform.node()
