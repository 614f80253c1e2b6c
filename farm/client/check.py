"""The preflight's look at a job before it leaves this machine, in a child process (farm_agent.work.check) that gets the
job's environment as a node gives it (its `env:` variables, its `requirements:` installed in this machine's cache):
the dataset loaded (its length is the job's item count), and the model built and run on CPU over the dataset's first
rows, so that a dtype or shape a node would fail on is one line here. Bounded in time and memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from farm.core.errors import SpecError
from farm.core.spec import ModelJobSpec
from farm.core.tasks import REQUIREMENTS_VAR

TIMEOUT_S = 300.0  # the job's requirements installed (once), torch and the model imported, one small batch
MEMORY_MB = 8192  # the child's resident memory: the dataset as this machine holds it, the model, one batch
POLL_S = 0.05


@dataclass(frozen=True)
class Preflight:
    items: int  # the dataset's length
    model_bytes: int  # the model's parameters and buffers; 0: not measured (the model not checked)
    checked: bool  # the model was built and ran on a small batch


def check_job(spec: ModelJobSpec, workdir: Path, check: bool = True, timeout_s: float = TIMEOUT_S,
              memory_mb: int = MEMORY_MB) -> Preflight:
    """What the child found; SpecError with the reason where a node would fail too."""
    located = spec.located_dataset  # read by the head and the nodes, not here: its preprocess must import
    args = json.dumps({"model": spec.model, "weights": spec.weights, "root": str(workdir), "check": check,
                       "dataset": spec.dataset if located is None else None, "more_datasets": list(spec.datasets[1:]),
                       "preprocess": located.preprocess if located is not None else None})
    env = {**os.environ, **spec.env}
    if spec.requirements and check:  # without the check, the dataset loads with what this machine has
        env[REQUIREMENTS_VAR] = json.dumps({"requirements": list(spec.requirements), "find_links": spec.find_links})
    child = subprocess.Popen([sys.executable, "-m", "farm_agent.work.check", args], cwd=workdir, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    began = time.monotonic()
    try:
        process = psutil.Process(child.pid)
        while child.poll() is None:
            if time.monotonic() - began > timeout_s:
                raise SpecError(f"the preflight took over {timeout_s:.0f} s to load the dataset and run the model "
                                "on one small batch (skip the model with --no-check)")
            try:
                rss = process.memory_info().rss
            except psutil.Error:  # it just ended
                rss = 0
            if rss > memory_mb * 2**20:
                raise SpecError(f"the preflight took over {memory_mb} MB to load the dataset and run the model on "
                                "one small batch (skip the model with --no-check)")
            time.sleep(POLL_S)
        out, err = child.communicate()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    try:
        answer = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise SpecError(f"the preflight ended without an answer (exit {child.returncode}): {last}") from None
    if "error" in answer:
        raise SpecError(str(answer["error"]))
    return Preflight(items=int(answer["items"]), model_bytes=int(answer.get("model_bytes", 0)), checked=check)
