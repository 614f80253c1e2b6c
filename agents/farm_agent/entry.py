"""The head's only door into the agent: the Ray entry points the head calls on a node, and the label that pins them
there. The head imports this module alone (through farm.head.remote); Ray pickles the entry points by reference,
so each node runs them from its own farm_agent. Light on purpose: the agent daemon imports NODE_LABEL from here,
and the work's modules (torch through them) load inside the Ray worker, at the first call.

A shard's entry point sends its result (or its failure) to the head itself, over the head's channel with the
attempt's upload ticket (farm_agent.upload), and returns None: the head never reads a Ray return value, which it
would have to unpickle."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from farm.core.kernels import KernelEvalTask
    from farm.core.tasks import EvaluateTask, ResultRoute, ShardFigures, ShardTask

# The Ray node label that names a Farm node: the agent starts its Ray worker with it, the head's tasks select on it.
NODE_LABEL = "farm.io/node"


def run_shard(task: ShardTask, route: ResultRoute) -> None:
    """A model over one shard's rows (inference): its outputs to the head batch by batch, then its figures."""
    from farm_agent.runner import run_shard as run
    from farm_agent.upload import figures, send

    send(route, lambda upload: figures(run(task, upload.write)))


def run_kernel_shard(task: KernelEvalTask, route: ResultRoute) -> None:
    """One problem's candidates through the hardened evaluator (kernel-eval): its rows as the table."""
    from farm_agent.kernel_eval import rows_table, run_kernel_shard as run
    from farm_agent.upload import Upload, figures, send

    def work(upload: Upload) -> ShardFigures:
        result = run(task)
        upload.write(rows_table(result.rows))
        return figures(result)

    send(route, work)


def run_evaluate_shard(task: EvaluateTask, route: ResultRoute) -> None:
    """A model over one shard's rows, scored against their labels (evaluate): its figures and mean loss alone."""
    from farm_agent.evaluate import evaluate_shard
    from farm_agent.upload import figures, send

    def work(upload: object) -> ShardFigures:
        result = evaluate_shard(task)
        return figures(result, loss=result.loss)

    send(route, work)


def train_worker() -> type:
    """The training worker's class, a Ray actor on one device (training)."""
    from farm_agent.trainer import TrainWorker

    return TrainWorker
