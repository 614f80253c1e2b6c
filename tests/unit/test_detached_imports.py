"""Issue 18 (12): a detached head or agent started from a folder that holds a `farm/` of its own (a checkout of Farm)
imported that folder instead of the installed package ("cannot import name '__version__' from 'farm'")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import farm
from farm.local import python_command


def test_a_detached_command_never_imports_from_the_current_folder(tmp_path: Path) -> None:
    (tmp_path / "farm").mkdir()
    (tmp_path / "farm" / "__init__.py").write_text("")  # a package named farm with no __version__
    run = subprocess.run(python_command("farm.cli.main", "--version"), cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert farm.__version__ in run.stdout
