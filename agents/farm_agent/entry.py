"""The one door between the head's kinds and the work on a node: the entry points a node's persistent worker runs
(by name, farm.core.wire.ENTRY_TASKS: ENTRIES here), and training's Ray actor (for trusted nodes, through
farm.head.remote). Light on purpose: the work's modules (torch through them) load inside the worker, at the first
call.

A shard's entry point sends its result (or its failure) to the head itself, over the head's channel with the
attempt's upload ticket (farm_agent.work.upload), and returns None: the head never reads anything a node made but
protobuf, Arrow IPC and safetensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from farm.core.kernels import KernelEvalTask
    from farm.core.tasks import EvaluateTask, ResultRoute, ShardFigures, ShardTask

def run_shard(task: ShardTask, route: ResultRoute) -> None:
    """A model over one shard's rows (inference): its outputs to the head batch by batch, then its figures."""
    from farm_agent.work.kinds.inference import run_shard as run
    from farm_agent.work.upload import figures, send

    send(route, lambda upload: figures(run(task, upload.write)))


def run_kernel_shard(task: KernelEvalTask, route: ResultRoute) -> None:
    """One problem's candidates through the hardened evaluator (kernel-eval): its rows as the table."""
    from farm_agent.work.kinds.kernel_eval import rows_table, run_kernel_shard as run
    from farm_agent.work.upload import Upload, figures, send

    def work(upload: Upload) -> ShardFigures:
        result = run(task)
        upload.write(rows_table(result.rows))
        return figures(result)

    send(route, work)


def run_evaluate_shard(task: EvaluateTask, route: ResultRoute) -> None:
    """A model over one shard's rows, scored against their labels (evaluate): its figures and mean loss alone."""
    from farm_agent.work.kinds.evaluate import evaluate_shard
    from farm_agent.work.upload import figures, send

    def work(upload: object) -> ShardFigures:
        result = evaluate_shard(task)
        return figures(result, loss=result.loss)

    send(route, work)


def train_worker() -> type:
    """The training worker's class, a Ray actor on one device (training)."""
    from farm_agent.work.kinds.training import TrainWorker

    return TrainWorker


# The entry points by the name an Assignment carries (farm.core.wire.ENTRY_TASKS names the same, with their types).
ENTRIES: dict[str, Callable[[Any, ResultRoute], None]] = {
    "run_shard": run_shard, "run_kernel_shard": run_kernel_shard, "run_evaluate_shard": run_evaluate_shard,
}
