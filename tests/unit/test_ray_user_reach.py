"""farm-ray must import Farm from where it sits. Python lists each folder it imports from (FileFinder caches a
directory's listing; one it may not list yields nothing), so a checkout cloned into a 0700 folder (`mktemp -d`) that
farm-ray could only pass through (`setfacl -m u:farm-ray:x`) imported no `farm`: every shard on such an agent failed
with ModuleNotFoundError. A folder Python imports from is granted read and execute; one it only passes, execute."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm import ray_user
from farm.switch_user import command_as

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="switching users needs root"),
    pytest.mark.skipif(shutil.which("setfacl") is None, reason="no setfacl (Debian: apt-get install acl)"),
]


@pytest.fixture()
def private_checkout() -> Iterator[Path]:
    """A package in a fresh 0700 folder under /tmp, as `mktemp -d && git clone . $d` leaves a checkout."""
    root = Path(tempfile.mkdtemp(prefix="farm-private-"))
    try:
        (root / "pkg" / "sub").mkdir(parents=True)
        (root / "pkg" / "__init__.py").write_text("")
        (root / "pkg" / "sub" / "__init__.py").write_text("WHERE = 'found'\n")
        yield root
    finally:
        shutil.rmtree(root)


def test_a_package_in_a_private_folder_becomes_importable_by_farm_ray_and_the_folder_stays_private(
        private_checkout: Path) -> None:
    user = ray_user.ensure(ray_user.DEFAULT)
    if ray_user.first_closed(user) is not None:
        pytest.skip("farm-ray cannot reach this Python itself (run ./scripts/setup as root)")
    package = private_checkout / "pkg"
    closed = ray_user.first_closed(user, [package])
    assert closed == ray_user.Closed(package, private_checkout, listed=True)

    assert ray_user.grant_passage(user, [package]) == [closed]
    assert ray_user.first_closed(user, [package]) is None
    imported = subprocess.run(command_as(user, [sys.executable, "-I", "-S", "-c", "import sys; sys.path.insert(0, "
                                                f"{str(private_checkout)!r}); import pkg.sub; print(pkg.sub.WHERE)"]),
                              capture_output=True, text=True, timeout=60, check=False)
    assert imported.stdout.strip() == "found", imported.stderr
    acl = subprocess.run(["getfacl", "-cp", str(private_checkout)], capture_output=True, text=True).stdout
    assert f"user:{user.pw_name}:r-x" in acl and "other::---" in acl  # for farm-ray alone
