"""The head's private Ray calls (farm.head.ray_compat) on the installed Ray: the token reload here; the code upload,
which needs a running cluster, in tests/integration/test_ray_compat.py."""

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
