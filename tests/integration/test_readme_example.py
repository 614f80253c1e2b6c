"""README's Python example (the block after `<!-- sdk-example -->`) runs as it is against a real farm."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, Cluster

pytestmark = pytest.mark.slow


def readme_example() -> str:
    found = re.search(r"<!-- sdk-example -->\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert found, "README lost its SDK example"
    return found.group(1)


def test_the_readme_sdk_example_runs(cluster: Cluster, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", readme_example()], cwd=ROOT, capture_output=True, text=True,
                            timeout=600, env={**os.environ, **cluster.env(),
                                              "FARM_CONFIG": str(tmp_path / "none.toml")})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("submitted j-") and lines[1].startswith("succeeded 540/540 items accuracy ")
    assert any(line.startswith("output ") for line in lines) or any("shard 0 done" in line for line in lines)
