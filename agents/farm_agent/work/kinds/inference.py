"""Runs one shard of an inference job in the persistent worker (farm_agent.work.host) of the device the scheduler
chose, in the job's code folder."""

from __future__ import annotations

import itertools
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import psutil
import pyarrow as pa

from farm.core.dataset import READ_ROUTE, ROW_ID, DataFormat, Unit
from farm.core.energy import Energy
from farm.core.errors import FarmError
from farm.core.phases import ShardPhases
from farm.core.tasks import SHARD_ROWS_ATTR, ResultRoute, ShardFigures, ShardResult, ShardTask, Tuning
from farm.data import Reach, reach, read
from farm.data.batches import column_to_numpy, model_inputs, numpy_batches, output_column, rebatch
from farm.data.decoders import AHEAD as DECODE_AHEAD
from farm.data.formats.images import FILE
from farm.data.results import OUTPUT
from farm_agent import backends
from farm_agent.backends.base import Backend
from farm_agent.work.capture import job_shard
from farm_agent.work.jobcode import load_dataset, load_model, resolve
from farm_agent.power import PowerMeter, meter_for
from farm_agent.work.prefetch import Prefetch, ReadAhead, Sender
from farm_agent.work.staging import staged

if TYPE_CHECKING:
    import torch

    from farm_agent.work.upload import Finishing, Upload

# What each loaded model has already run in this worker process: (device, tuning, batch rows). load_model keeps
# models cached, and a worker runs every shard of its job on its device, whose tuning may differ between them.
_warm: weakref.WeakKeyDictionary[torch.nn.Module, set[tuple[str, Tuning, int]]] = weakref.WeakKeyDictionary()


@job_shard
def run_shard(task: ShardTask, out: Callable[[pa.Table], None], later: bool = False,
              ahead: Prefetch[ModelBatch] | None = None, way: Reach | None = None) -> ShardResult:
    """Stream the shard's rows batch by batch through the preprocess (when the dataset has one) and the model, inside
    the device's energy window; each batch's results (row_id, passthrough columns, `output`) go to `out` as they are
    made (to the head's upload: farm_agent.work.upload), and the shard's figures are returned.

    The preprocess runs inside the window, interleaved with the model: streaming keeps a worker's memory at a few
    batches whatever the shard's size, and the time and energy the scheduler learns from are then what a row costs on
    that node from its bytes to its outputs. Only the first batch is read and prepared before the window, to warm
    the model up on it; a thread reads the next batches (prefetch.DEPTH) ahead of the model, from then on, so that
    reading overlaps compute (an image folder's next DECODE_AHEAD batches decoding on the pool meanwhile): the few
    batches it reads during the warm-up are read outside the window. `later`: the
    energy may be found after the shard returns (ShardResult.energy_later), so that its device starts the next one
    meanwhile. `ahead`: its batches, read from before it started (read_ahead), the reader now this shard's, and
    `way` the way that reader reached the dataset (reported as the shard's route: the one its rows came by)."""
    root = Path.cwd()
    if way is None and task.data is not None:
        way = reach(task.data.plan, task.data.access)
    if way is not None and way.why:  # a shared path read through the head after all: the shard's log says why
        print(f"farm: the dataset is read {way.route.text}: {way.why}")
    # The reader starts first: its first batch (an image folder's decoder processes starting with it) is read while
    # the model loads.
    stream = ahead if ahead is not None else Prefetch(model_batches(task, root, way))
    with closing(stream):  # closing: the reader stops if the model fails
        began = time.perf_counter()
        module = load_model(task.model, task.weights, root)
        result = _run(task, module, backends.load(task.backend), stream, out, later,
                      loaded=time.perf_counter() - began)
    return replace(result, read_route=way.route if way is not None else None)


def _run(task: ShardTask, module: torch.nn.Module, backend: Backend, stream: Iterator[ModelBatch],
         out: Callable[[pa.Table], None], later: bool = False, loaded: float = 0.0) -> ShardResult:
    """`loaded`: the seconds its model took to load (ShardPhases.load)."""
    asked = time.perf_counter()
    first = next(stream, None)
    came = time.perf_counter()
    if first is None:  # a byte range holding no line start: nothing to run
        return _result(task, 0, 0.0, None, None)
    warmed = 0.0
    if backend.WARM_UP_SHAPES:  # a backend whose first batch of a shape costs little (cpu) says not
        with _at_rows(task, first):
            _warm_up(backend, module, first.inputs, task, task.stop - task.start if task.data is None
                     or task.data.plan.unit is Unit.ROWS else None)
        warmed = time.perf_counter() - came
    _reset_peak_memory(task.device)
    rows, correct, waited, sent = 0, None, 0.0, 0.0
    meter = _meter(task.device)
    if hasattr(meter, "defer"):
        meter.defer = later
    sender: Sender[tuple[pa.RecordBatch, np.ndarray]] = Sender(
        lambda made: out(pa.Table.from_batches([made[0]]).append_column(OUTPUT, output_column(made[1]))))
    with meter.window() as window, sender as sending:
        began = ready = time.perf_counter()  # ready: when the model could take the next batch
        for batch in itertools.chain([first], stream):
            waited += time.perf_counter() - ready
            with _at_rows(task, batch):
                outputs = backend.run(module, batch.inputs, task.batch_size, task.device, task.threads, task.tuning)
            if len(outputs) != batch.table.num_rows:
                raise FarmError(f"the model returned {len(outputs)} outputs for {batch.table.num_rows} rows")
            clock = time.perf_counter()
            sending.put((batch.table, outputs))  # waits only while SEND_DEPTH batches are still being sent
            ready = time.perf_counter()
            sent += ready - clock
            rows += len(outputs)
            if batch.labels is not None and outputs.ndim == 2:  # class scores: count the argmax that hits the label
                correct = (correct or 0) + int((np.argmax(outputs, axis=1) == batch.labels).sum())
        clock = time.perf_counter()
        sending.close()  # the last batches' outputs sent: inside the window, as the shard's own work
        ended = time.perf_counter()
        sent += ended - clock
        waited += clock - ready  # the reader's end, after the last batch
        seconds = ended - began
    # The forward the shard's full batches ran and what its tuning cost (a backend with a tuner says: cuda's), taken
    # even by the A/B's eager side, whose shard ran none: the next shard reports only its own.
    outcome = getattr(backend, "take_outcome", lambda m, d: None)(module, task.device)
    # A tuning run made on the warm-up's batch is its own phase (one made later, on a full batch in the window, stays
    # in the model's share there).
    tuned = outcome.tuning_s if outcome is not None and outcome.tuning_s <= warmed else 0.0
    phases = ShardPhases(load=loaded, first_batch=came - asked, warm_up=warmed - tuned, tuning=tuned,
                         input_wait=waited, output=sent)
    outcome = None if task.tuning.eager else outcome
    result = replace(_result(task, rows, seconds, correct, None if later else window.energy), tuning=outcome,
                     phases=phases)
    return replace(result, energy_later=lambda: window.energy) if later else result


@contextmanager
def _at_rows(task: ShardTask, batch: ModelBatch) -> Iterator[None]:
    """A model's exception says where in the shard it happened: the shard's range and the batch's first row id
    (for line files, both in bytes: a row's id is its byte offset)."""
    try:
        yield
    except Exception as exc:
        first = batch.table.column(ROW_ID)[0].as_py() if batch.table.num_rows else task.start
        lines = task.data is not None and task.data.plan.unit is Unit.BYTES
        where = (f"bytes {task.start}-{task.stop - 1}, the batch from the row at byte {first}" if lines
                 else f"rows {task.start}-{task.stop - 1}, the batch from row {first}")
        with suppress(AttributeError, TypeError):  # an exception type without a __dict__ goes on as it is
            setattr(exc, SHARD_ROWS_ATTR, where)
        raise


def _result(task: ShardTask, rows: int, seconds: float, correct: int | None, energy: Energy | None) -> ShardResult:
    ray = sys.modules.get("ray")  # imported by a Ray actor only: importing it here cost a shard 0.3 s
    node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else ""
    return ShardResult(items=rows, seconds=seconds, correct=correct,
                       node_ray_id=node, energy=energy, peak_memory_bytes=_peak_memory(task.device))


@dataclass(frozen=True)
class ModelBatch:
    table: pa.RecordBatch  # row_id and the passthrough columns
    inputs: np.ndarray  # what the model reads
    labels: np.ndarray | None


AHEAD: ReadAhead[ModelBatch, Reach] = ReadAhead()  # this worker's next shard, read while one runs


def model_batches(task: ShardTask, root: Path, way: Reach | None = None) -> Iterator[ModelBatch]:
    """The shard's rows, `batch_size` at a time, as the model reads them; `way`: how this node reaches a located
    dataset (farm.data.reach, found once a shard)."""
    if task.data is None:  # a callable or a .npy/.npz/.pt file in the job's code: loaded whole, sliced here
        inputs, labels = load_dataset(task.dataset, root)
        for start in range(task.start, task.stop, task.batch_size):
            stop = min(start + task.batch_size, task.stop)
            table = pa.record_batch({ROW_ID: pa.array(range(start, stop), pa.int64())})
            yield ModelBatch(table, inputs[start:stop], None if labels is None else labels[start:stop])
        return
    spec, plan = task.data.spec, task.data.plan
    columns = plan.model_inputs(spec)
    wanted = list(dict.fromkeys([*columns, *spec.passthrough, *spec.label_columns]))
    needed = wanted
    if plan.format is DataFormat.IMAGES:  # a local folder's files read by its decoders, unless passed through
        needed = ["image" if "image" in spec.passthrough else FILE, "path"]
    preprocess = resolve(spec.preprocess, root, "preprocess") if spec.preprocess else None
    way = way or reach(plan, task.data.access)
    stream = read(plan, task.start, task.stop, needed, task.batch_size, fs=way.fs, root=way.root,
                  workers=max(task.threads, 1))
    for batch, arrays in numpy_batches(rebatch(stream, task.batch_size), columns, plan.format, plan.location,
                                       workers=max(task.threads, 1), ahead=DECODE_AHEAD):
        inputs = model_inputs(arrays, columns, plan.location, preprocess, spec.preprocess or "")
        labels = None
        if spec.label:
            labels = column_to_numpy(batch.column(spec.label), spec.label, batch.column(ROW_ID).to_pylist(),
                                     plan.location)
        kept = batch.select([ROW_ID, *spec.passthrough])
        yield ModelBatch(kept, staged(inputs, task.device), labels)  # pinned here, in the reader's thread


def _warm_up(backend: Backend, module: torch.nn.Module, sample: np.ndarray, task: ShardTask,
             rows: int | None = None) -> None:
    """The shard's batch shapes (a full batch, and its short last one) run once outside the measured window, the
    first time this worker runs them on the device: `sample` is the shard's first rows, `rows` its length (None:
    unknown, as a byte range of lines is until it is read; its last batch then warms inside the window).

    A model's first batch pays one-off costs: the CUDA context and its kernels' lazy loading, cuDNN's algorithm
    search, the allocator's first blocks, and the kernel tuner's search or its winner's compilation; a new batch
    shape loads kernels of its own. On the H200 a cold first shard took 4-10x a warm one, and with the full batch
    warmed alone, a shard whose last batch had 4 rows still took 25x. Inside the window these costs would be billed
    to the device's calibration, which would then rank the device by its start-up.
    """
    rows = len(sample) if rows is None and task.data is None else rows
    warmed = _warm.setdefault(module, set())
    shapes = {min(task.batch_size, len(sample))} | ({rows % task.batch_size} if rows is not None else set())
    tuning = replace(task.tuning, rows_left=None)  # the same forward whatever rows are left
    for size in shapes - {0}:
        if size <= len(sample) and (task.device, tuning, size) not in warmed:
            backend.run(module, sample[:size], task.batch_size, task.device, task.threads, task.tuning)
            warmed.add((task.device, tuning, size))


def _reset_peak_memory(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device: str) -> int:
    """Bytes the shard needed: the GPU's peak allocation over the shard (the model's weights included), or this
    worker's resident memory for host devices (an upper bound: it holds the Python runtime and torch as well)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    return int(psutil.Process().memory_info().rss)


@lru_cache(maxsize=8)
def _meter(device: str) -> PowerMeter:
    """One meter per device for the life of this worker process (an NVML session is worth keeping)."""
    return meter_for(device)


def read_ahead(task: ShardTask, ticket: str) -> None:
    """Start reading `ticket`'s shard (the worker's next, sent while one runs): its first batches wait, read and
    decoded, for its attempt (AHEAD). Only a located dataset's: a job's own dataset is its code's to load."""
    if task.data is not None:
        way = reach(task.data.plan, task.data.access)
        AHEAD.start(ticket, model_batches(task, Path.cwd(), way), way)


def attempt(task: ShardTask, route: ResultRoute) -> ShardFigures | Finishing | None:
    """One attempt of an inference shard in its worker: its outputs to the head batch by batch, then its figures."""
    from farm_agent.work.upload import figures, send

    ahead, way = AHEAD.take(route.ticket) or (None, None)

    def work(upload: Upload) -> Callable[[], ShardFigures]:
        result = run_shard(task, upload.write, later=True, ahead=ahead, way=way)
        energy = result.energy_later or (lambda: result.energy)
        route = {READ_ROUTE: float(result.read_route)} if result.read_route is not None else {}
        phases = result.phases.metrics() if result.phases is not None else {}
        return lambda: figures(replace(result, energy=energy(), energy_later=None), **route, **phases)

    try:
        return send(route, work)
    finally:
        if ahead is not None:  # run_shard closed it where it ran; this, where it did not (no upload opened)
            ahead.close()
