"""A job's environment on real nodes: `env:` reaches its processes, `requirements:` are installed on each node from a
wheel folder (no index, no internet) once per set, and an install that fails fails the job with pip's reason."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml

from farm.data.results import read_predictions
from tests.conftest import Cluster, farm
from tests.wheels import make_wheel

pytestmark = pytest.mark.slow


def test_env_and_requirements_reach_the_jobs_code(cluster: Cluster, tmp_path: Path) -> None:
    package = f"farmtiny_{uuid.uuid4().hex[:8]}"  # new to every run: no node has it cached from before
    wheels = tmp_path / "wheels"
    make_wheel(wheels, package, "0.1", "OFFSET = 1000\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "envjob.py").write_text(
        "import os\n\nimport torch\n\n"
        f"import {package}\n\n\n"
        "class Shift(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        f"        return x * int(os.environ['FARM_TEST_FACTOR']) + {package}.OFFSET\n\n\n"
        "def build():\n    return Shift()\n"
    )
    (work / "envdata.py").write_text(  # apart from the model: the --no-check submit below loads only the dataset
        "import numpy as np\n\n\ndef numbers():\n    return np.arange(16, dtype=np.float32).reshape(8, 2)\n")
    spec = {"name": "env", "model": "envjob:build", "dataset": "envdata:numbers", "shards": 2, "backends": ["cpu"],
            "env": {"FARM_TEST_FACTOR": 3}, "requirements": [f"{package}==0.1"], "find_links": str(wheels),
            "output": str(tmp_path / "out")}
    (work / "env.yaml").write_text(yaml.safe_dump(spec))
    # The spec's env names FARM_TEST_FACTOR: refused (FARM_ is Farm's). Rename and go.
    refused = cluster.farm("submit", str(work / "env.yaml"), "--workdir", str(work))
    assert refused.returncode == 2 and "names starting with RAY_ or FARM_" in refused.stderr
    (work / "envjob.py").write_text((work / "envjob.py").read_text().replace("FARM_TEST_FACTOR", "TEST_FACTOR"))
    spec["env"] = {"TEST_FACTOR": 3}
    (work / "env.yaml").write_text(yaml.safe_dump(spec))

    try:
        # The preflight installs the set too, on this machine: into a cache of its own, as a laptop would.
        result = farm("submit", str(work / "env.yaml"), "--wait", "--json", "--workdir", str(work),
                      env={**cluster.env(), "FARM_REQUIREMENTS_CACHE": str(tmp_path / "laptop-cache")})
        assert result.returncode == 0, result.stderr + result.stdout
        job = json.loads(result.stdout)
        np.testing.assert_array_equal(read_predictions(Path(job["output"])),
                                      np.arange(16).reshape(8, 2) * 3 + 1000)
        printed = [line["message"] for line in json.loads(cluster.farm("logs", job["id"], "--json").stdout)
                   if line["level"] == "output"]
        assert any("installed on node n-" in text for text in printed), printed

        # The same set again: each node already has it.
        spec["output"] = str(tmp_path / "out2")
        (work / "env.yaml").write_text(yaml.safe_dump(spec))
        again = json.loads(cluster.farm("submit", str(work / "env.yaml"), "--wait", "--json", "--workdir",
                                        str(work)).stdout)
        assert again["state"] == "succeeded"
        printed = [line["message"] for line in json.loads(cluster.farm("logs", again["id"], "--json").stdout)
                   if line["level"] == "output"]
        assert printed and all("from this node's cache" in text for text in printed), printed

        # A requirement no node can install: the job fails with pip's reason, naming the node.
        spec.update(requirements=[f"{package}==9.9"], output=str(tmp_path / "out3"))
        (work / "env.yaml").write_text(yaml.safe_dump(spec))
        failed = cluster.farm("submit", str(work / "env.yaml"), "--wait", "--json", "--workdir", str(work),
                              "--no-check")
        job = json.loads(failed.stdout)
        assert failed.returncode == 1 and job["state"] == "failed"
        assert "pip could not install the job's requirements on node n-" in job["error"]
        assert f"No matching distribution found for {package}==9.9" in job["error"]
    finally:
        from farm_agent.work.environment import cache_root

        for folder in cache_root().glob("*"):  # this test's sets: the one that has its package
            if any(folder.rglob(f"{package}*")):
                shutil.rmtree(folder, ignore_errors=True)
