"""A kernel-eval shard on a lent node's persistent worker starts no Ray of its own: it asked Ray's runtime context
for its node id, which started a local Ray instance inside the worker at every shard (slow, and on a loaded box it
timed out: "The current node timed out during startup", a failed shard in CI)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import ray

from farm.core.kernels import KernelEvalTask, KernelPair
from farm_agent.work.kinds.kernel_eval import run_kernel_shard
from tests.conftest import FIXTURES


def test_a_kernel_shard_outside_ray_starts_no_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not ray.is_initialized()
    (tmp_path / "problems").mkdir()
    (tmp_path / "candidates" / "relu").mkdir(parents=True)
    shutil.copy(FIXTURES / "kernels" / "problems" / "relu.py", tmp_path / "problems" / "relu.py")
    shutil.copy(FIXTURES / "kernels" / "candidates" / "honest_relu.py", tmp_path / "candidates" / "relu" / "honest.py")
    monkeypatch.chdir(tmp_path)  # a worker runs in its job's code folder
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("the shard started a Ray instance"))
    task = KernelEvalTask(job_id="j-1", index=0, pairs=(KernelPair("problems/relu.py", "candidates/relu/honest.py"),),
                          backend="cpu", device="cpu", runs=3, timeout_s=60.0)
    result = run_kernel_shard(task)
    assert not ray.is_initialized()
    assert [row.correct for row in result.rows] == [True]
