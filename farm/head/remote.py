"""The head's one import of the agent (farm_agent.entry): its Ray entry points made remote, and how a call is pinned
to a node's device. Handlers name the entry point a shard runs; the dispatcher and the training driver place it."""

from __future__ import annotations

from typing import Any

import ray

from farm_agent import entry

NODE_LABEL = entry.NODE_LABEL

# No Ray retries: a failed shard goes back through the head's own retry path (farm.head.outcomes), which knows
# whether the node or the job's code failed.
run_shard = ray.remote(num_cpus=0, max_retries=0)(entry.run_shard)
run_kernel_shard = ray.remote(num_cpus=0, max_retries=0)(entry.run_kernel_shard)
run_evaluate_shard = ray.remote(num_cpus=0, max_retries=0)(entry.run_evaluate_shard)
TrainWorker = ray.remote(num_cpus=0, max_restarts=0)(entry.train_worker())


def pinned(node_id: str, backend: str, runtime_env: dict[str, Any], name: str) -> dict[str, Any]:
    """Ray options that run a call on this node, in one slot of this backend, in the job's environment (its code as
    the cwd: farm.head.environment)."""
    return {
        "label_selector": {NODE_LABEL: node_id}, "resources": {f"farm.{backend}": 1}, "runtime_env": runtime_env,
        "name": name,
    }
