"""farm.head.ray_compat.upload_code on a real Ray cluster of its own: a job's zipped code, uploaded once, is the cwd
of a task that names it as its working_dir; drop_code removes it from the GCS."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import io
import zipfile

import ray

from farm.head.ray_compat import drop_code, upload_code

buffer = io.BytesIO()
with zipfile.ZipFile(buffer, "w") as archive:
    archive.writestr("hello.txt", "from the job's code")
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    uri = upload_code(buffer.getvalue())
    assert upload_code(buffer.getvalue()) == uri  # the same bytes: the same package, not a second upload


    @ray.remote(num_cpus=0)
    def read() -> str:
        return open("hello.txt").read()


    text = ray.get(read.options(runtime_env={"working_dir": uri}).remote())
    drop_code(uri)  # a deleted job's: out of the GCS, which would keep it as long as this driver lives
    from ray._private.runtime_env import packaging
    print(uri, packaging.package_exists(uri), text)
finally:
    ray.shutdown()
"""


def test_uploaded_code_is_the_working_dir_of_a_task() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # a cluster of its own, no token
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    uri, kept, text = done.stdout.strip().splitlines()[-1].split(" ", 2)
    assert uri.startswith("gcs://_ray_pkg_") and uri.endswith(".zip") and text == "from the job's code"
    assert kept == "False"  # dropped
