"""The head's one import of the agent for Ray (farm_agent.entry): training's worker made a Ray actor, and how it is
pinned to a trusted node's device. Only trusted nodes join the head's Ray; every other shard goes to its node over
the node's work stream (farm.head.links), never through Ray."""

from __future__ import annotations

from typing import Any

import ray

from farm.core.ids import NODE_LABEL
from farm_agent import entry

# No Ray restarts: a failed stretch goes back through the head's own retry path (farm.head.outcomes).
# Any: the class is made at run time (entry.train_worker), so Ray's typing of its actors says nothing useful.
TrainWorker: Any = ray.remote(num_cpus=0, max_restarts=0)(entry.train_worker())


def pinned(node_id: str, backend: str, runtime_env: dict[str, Any], name: str) -> dict[str, Any]:
    """Ray options that run a call on this node, in one slot of this backend, in the job's environment (its code as
    the cwd: farm.head.environment)."""
    return {
        "label_selector": {NODE_LABEL: node_id}, "resources": {f"farm.{backend}": 1}, "runtime_env": runtime_env,
        "name": name,
    }
