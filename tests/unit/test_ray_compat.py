"""The head's private Ray calls (farm.head.ray_compat) on the installed Ray: the token reload and loopback kept here;
the code upload and drop, which need a running cluster, in tests/integration/test_ray_compat.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from pathlib import Path

from ray._raylet import AuthenticationTokenLoader

from farm.head.ray_compat import use_ray_token

assert not AuthenticationTokenLoader.instance().has_token()  # read when Ray was imported: none then
use_ray_token(Path(sys.argv[1]))
loader = AuthenticationTokenLoader.instance()
print(loader.has_token(), loader.get_raw_token())
"""


def test_use_ray_token_makes_ray_read_farms_token_after_its_import(tmp_path: Path) -> None:
    """Ray caches its auth settings at import; without the reload this driver would present no token."""
    token = tmp_path / "ray-token"
    token.write_text("s3cret-ray-token")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(token)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "s3cret-ray-token"]


LOOPBACK = """
from ray._private import services

from farm.head.ray_compat import keep_loopback

before = services.canonicalize_bootstrap_address("127.0.0.1:7701")
keep_loopback()
print(before, services.canonicalize_bootstrap_address("127.0.0.1:7701"), services.resolve_ip_for_localhost("10.1.2.3"))
"""


def test_keep_loopback_lets_the_driver_reach_a_ray_head_on_loopback() -> None:
    """Ray 2.60 turns 127.0.0.1 into the machine's reachable address, where a head on loopback does not listen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run([sys.executable, "-c", LOOPBACK], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    _, after, other = done.stdout.split()  # before: this machine's reachable address, where it has one
    assert (after, other) == ("127.0.0.1:7701", "10.1.2.3")
