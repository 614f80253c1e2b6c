"""Runs one shard of an evaluate job in the device's persistent worker: the model over the shard's rows (as inference
runs it, on the chosen backend, its energy measured), scored against their labels. Returns figures only: no outputs
leave the node."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from farm.core.errors import SpecError
from farm.core.tasks import EvaluateResult, EvaluateTask, ResultRoute, ShardFigures
from farm.data.batches import concat
from farm.data.results import outputs_array
from farm_agent.work.capture import job_shard
from farm_agent.work.jobcode import load_dataset
from farm_agent.work.kinds.inference import run_shard
from farm_agent.work.kinds.training import loss_function

if TYPE_CHECKING:
    from farm_agent.work.upload import Finishing


@job_shard
def evaluate_shard(task: EvaluateTask) -> EvaluateResult:
    import torch

    shard = task.shard
    root = Path.cwd()
    _, labels = load_dataset(shard.dataset, root)  # cached: run_shard reads the same
    if labels is None:
        raise SpecError(f"dataset {shard.dataset!r} gives no labels: evaluate needs (inputs, labels)")
    loss = loss_function(task.loss, root)
    tables: list[pa.Table] = []
    ran = run_shard(shard, tables.append)  # the outputs stay here: only the figures go to the head
    outputs = outputs_array(concat(tables), shard.dataset)  # the shard's rows in order
    with torch.no_grad():
        value = float(loss(torch.from_numpy(outputs), torch.as_tensor(labels[shard.start : shard.stop])))
    return EvaluateResult(items=ran.items, seconds=ran.seconds, correct=ran.correct, loss=value,
                          node_ray_id=ran.node_ray_id, energy=ran.energy, peak_memory_bytes=ran.peak_memory_bytes)


def attempt(task: EvaluateTask, route: ResultRoute) -> ShardFigures | Finishing | None:
    """A model over one shard's rows scored against their labels, in its worker: its figures and mean loss alone."""
    from farm_agent.work.upload import figures, send

    def work(upload: object) -> ShardFigures:
        result = evaluate_shard(task)
        return figures(result, loss=result.loss)

    return send(route, work)
