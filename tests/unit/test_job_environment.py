"""A job's environment on a node (farm_agent.work.environment): pip requirements installed once per node and distinct set,
from a local wheel folder (no index, no internet), then importable; a failed install is one clear line."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from farm.core.spec import parse_spec
from farm.head.environment import runtime_env
from farm_agent.work.environment import RequirementsError, add_to_path, ensure_installed
from tests.wheels import make_wheel

pytestmark = pytest.mark.slow  # pip runs


def test_requirements_install_once_and_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    name = f"farmtiny_{uuid.uuid4().hex[:8]}"
    make_wheel(tmp_path / "wheels", name, "0.1", "OFFSET = 1000\n")
    cache = tmp_path / "cache"
    folder = ensure_installed([f"{name}==0.1"], str(tmp_path / "wheels"), root=cache)
    assert "1 installed on" in capsys.readouterr().out
    monkeypatch.setattr(sys, "path", list(sys.path))
    add_to_path(folder)
    assert __import__(name).OFFSET == 1000
    # Again (another worker, another job with the same set): from the cache, pip not run.
    assert ensure_installed([f"{name}==0.1"], str(tmp_path / "wheels"), root=cache) == folder
    assert "from this node's cache" in capsys.readouterr().out
    # numpy is already in the node's environment: it satisfies a requirement without being installed again.
    numpy_too = ensure_installed(["numpy", f"{name}==0.1"], str(tmp_path / "wheels"), root=cache)
    assert not (numpy_too / "numpy").exists() and (numpy_too / name).is_dir()


def test_a_failed_install_says_what_pip_said_and_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "wheels").mkdir()
    with pytest.raises(RequirementsError) as caught:
        ensure_installed(["farm-no-such-package==9.9"], str(tmp_path / "wheels"), root=tmp_path / "cache")
    message = caught.value.message
    assert message.startswith("pip could not install the job's requirements on ")
    assert "No matching distribution found for farm-no-such-package==9.9" in message and "\n" not in message
    assert "ERROR" in capsys.readouterr().out  # pip's whole answer, for the shard's log
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]  # nothing half-made kept


def test_the_head_hands_env_and_requirements_to_the_tasks_runtime_env() -> None:
    spec = parse_spec("name: x\nmodel: a:b\ndataset: a:c\nenv: {OMP_NUM_THREADS: 2}\n"
                      "requirements: [tinypkg==0.1]\nfind_links: /srv/wheels\n")
    env = runtime_env(spec, "gcs://_ray_pkg_x.zip")
    assert env["working_dir"] == "gcs://_ray_pkg_x.zip" and env["env_vars"]["OMP_NUM_THREADS"] == "2"
    assert json.loads(env["env_vars"]["FARM_REQUIREMENTS"]) == {"requirements": ["tinypkg==0.1"],
                                                                 "find_links": "/srv/wheels"}
    assert runtime_env(parse_spec("name: x\nmodel: a:b\ndataset: a:c\n"), "u") == {"working_dir": "u"}
