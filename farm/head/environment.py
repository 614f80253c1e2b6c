"""A job's environment on the nodes, as the Ray runtime_env of its tasks: its code (working_dir), its variables
(`env:`) and its pip requirements (`requirements:`, handed to farm_agent.environment through REQUIREMENTS_VAR)."""

from __future__ import annotations

import json
from typing import Any

from farm.core.spec import JobSpec
from farm.core.tasks import REQUIREMENTS_VAR


def runtime_env(spec: JobSpec, working_dir: str) -> dict[str, Any]:
    env_vars = dict(spec.env)
    if spec.requirements:
        env_vars[REQUIREMENTS_VAR] = json.dumps({"requirements": list(spec.requirements),
                                                 "find_links": spec.find_links})
    return {"working_dir": working_dir, **({"env_vars": env_vars} if env_vars else {})}
