"""The head's only door into the agent: the Ray entry points the head calls on a node, and the label that pins them
there. The head imports this module alone (through farm.head.remote); Ray pickles the entry points by reference,
so each node runs them from its own farm_agent. Light on purpose: the agent daemon imports NODE_LABEL from here,
and the work's modules (torch through them) load inside the Ray worker, at the first call."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from farm.core.kernels import KernelEvalShardResult, KernelEvalTask
    from farm.core.tasks import EvaluateResult, EvaluateTask, ShardResult, ShardTask

# The Ray node label that names a Farm node: the agent starts its Ray worker with it, the head's tasks select on it.
NODE_LABEL = "farm.io/node"


def run_shard(task: ShardTask) -> ShardResult:
    """A model over one shard's rows (inference)."""
    from farm_agent.runner import run_shard as run

    return run(task)


def run_kernel_shard(task: KernelEvalTask) -> KernelEvalShardResult:
    """One problem's candidates through the hardened evaluator (kernel-eval)."""
    from farm_agent.kernel_eval import run_kernel_shard as run

    return run(task)


def run_evaluate_shard(task: EvaluateTask) -> EvaluateResult:
    """A model over one shard's rows, scored against their labels (evaluate)."""
    from farm_agent.evaluate import evaluate_shard

    return evaluate_shard(task)


def train_worker() -> type:
    """The training worker's class, a Ray actor on one device (training)."""
    from farm_agent.trainer import TrainWorker

    return TrainWorker
