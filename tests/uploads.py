"""A shard's upload as its node's entry point sends it (farm_agent.work.upload's own encoding), for tests that drive the
head's side in this process: the table's Arrow IPC stream in parts, then the figures or the failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa

from farm.core.tasks import ShardFigures, ShardTask
from farm.core.models import Node
from farm.data.batches import concat, output_column
from farm.head import arrivals
from farm.head.arrivals import Arrival
from farm.head.dispatch import Dispatcher
from farm.head.store import Store
from farm.proto.convert import figures_to_pb
from farm.proto.v1 import result_pb2
from farm_agent.work.upload import TableParts


def parts(tables: Iterable[pa.Table] = (), figures: ShardFigures | None = None,
          failure: result_pb2.ShardFailure | None = None) -> list[result_pb2.UploadPart]:
    sent: list[result_pb2.UploadPart] = []
    encoder = TableParts(sent.append)
    for table in tables:
        encoder.write_table(table)
    encoder.close()
    if figures is not None:
        sent.append(result_pb2.UploadPart(figures=figures_to_pb(figures)))
    if failure is not None:
        sent.append(result_pb2.UploadPart(failure=failure))
    return sent


async def stream(sent: Iterable[result_pb2.UploadPart]) -> AsyncIterator[result_pb2.UploadPart]:
    for part in sent:
        yield part


def arrive(staging: Path | None, tables: Iterable[pa.Table] = (), **fields: object) -> Arrival:
    """What the head makes of an upload of `tables` and ShardFigures(**fields)."""
    return asyncio.run(arrivals.receive(stream(parts(tables, ShardFigures(**fields))), staging,  # type: ignore[arg-type]
                                        lambda: True))


def run_here(task: ShardTask) -> tuple[object, pa.Table]:
    """The node's runner in this process: its figures and the table it would stream."""
    from farm_agent.work.kinds.inference import run_shard

    tables: list[pa.Table] = []
    result = run_shard(task, tables.append)
    return result, concat(tables)


def succeed_shard(store: Store, dispatcher: Dispatcher, job_id: str, index: int, node: Node) -> None:
    """Shard `index` of a toy inference job starts on `node` (its cpu), its rows arrive (zeros, two columns) as its
    upload would bring them and are recorded; the job ends if that was its last shard."""
    job = store.job(job_id)
    handler, spec = dispatcher.handler(job), dispatcher.spec(job)
    store.shard_started(job_id, index, node, "cpu", "cpu")
    shard = store.job(job_id).shards[index]
    rows = pa.table({"row_id": pa.array(range(shard.start, shard.stop), pa.int64()),
                     "output": output_column(np.zeros((shard.stop - shard.start, 2), np.float32))})
    result = arrive(handler.staging(store.job(job_id), index), [rows], items=shard.stop - shard.start, seconds=0.1)
    dispatcher.outcomes.succeeded(job_id, index, handler.record(store.job(job_id), spec, shard, result))
    dispatcher.outcomes.finish_if_done(job_id, handler, spec)
