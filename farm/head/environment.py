"""A job's environment on the nodes: its variables (`env:`) and its pip requirements (`requirements:`, handed to
farm_agent's environment through REQUIREMENTS_VAR); as a shard's worker gets them (worker_env), and as the Ray
runtime_env of a training job's actors on trusted nodes (runtime_env, with its code as the working_dir)."""

from __future__ import annotations

import json
from typing import Any

from farm.core.spec import JobSpec
from farm.core.tasks import REQUIREMENTS_VAR


def worker_env(spec: JobSpec) -> dict[str, str]:
    """The variables a job's workers run with, beside the node's own few (farm_agent's work.host)."""
    env_vars = dict(spec.env)
    if spec.requirements:
        env_vars[REQUIREMENTS_VAR] = json.dumps({"requirements": list(spec.requirements),
                                                 "find_links": spec.find_links})
    return env_vars


def runtime_env(spec: JobSpec, working_dir: str) -> dict[str, Any]:
    env_vars = worker_env(spec)
    return {"working_dir": working_dir, **({"env_vars": env_vars} if env_vars else {})}
