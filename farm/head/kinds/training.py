"""`kind: training`: the job's workers train together, from checkpoint to checkpoint.

A training job's shards are stretches of steps between checkpoints ([start, stop) in steps). Its workers step
together, so this kind drives them itself rather than through the dispatcher's shard tasks: for each start (and each
resume) it picks the workers (`farm.scheduler.training`), starts one Ray actor per device (the agent's TrainWorker,
pinned by node label like any shard), joins them in a collective group, measures their speed and splits the global
batch by it. Then each stretch: train, take rank 0's state as the checkpoint (written atomically, named by its
step), score it on the eval set, record the stretch like a shard (seconds, samples, energy), and re-split the batch
by the speeds just measured.

Whatever stops a stretch (a node lost, a worker crashed, the head restarted) sends it back to pending through the
shared retry path; the next start resumes from the checkpoint at that stretch's first step, with the nodes that
remain.

Every call's result comes back by its upload ticket (farm.head.dispatch.Dispatcher.expect; the worker's `call`
sends it), never as a Ray return value, which the head would have to unpickle; Ray only says, through ray.wait, which
calls ended. A checkpoint is safetensors: the head reads tensors and numbers from it, never a pickle.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray

from farm.core.backends import BACKENDS
from farm.core.energy import energy_sum
from farm.core.errors import FarmError, SpecError
from farm.core.ids import new_id
from farm.core.models import BackendName, Node, NodeState, ShardState
from farm.core.spec import MAX_SHARDS, MAX_STEPS, JobKind, SyncMode, TrainingSpec
from farm.core.tasks import ResultRoute
from farm.head import environment, joblog, remote
from farm.head.arrivals import Arrival, figures
from farm.head.kinds.base import Driver, KindHandler, Plan, Submission, check_model_files, model_key
from farm.head.outcomes import NodeLost, ShardRecord, Uploaded, sort_failure
from farm.head.settings import HeadSettings
from farm.head.output import atomic_write
from farm.head.store import Job, Store
from farm.scheduler import ShardRequest, calibration
from farm.scheduler.training import NoWorkers, batch_shares, choose_workers
from farm.scheduler.types import Assignment

log = logging.getLogger("farm.head")

# How often a running stretch looks at its workers' nodes, in seconds.
WATCH_S = 1.0
MODEL = "model.pt"


def checkpoint_path(output: Path, step: int) -> Path:
    return output / "checkpoints" / f"step-{step:08d}.safetensors"


@dataclass(frozen=True)
class Call:
    """One worker's call: its Ray task (only ever waited on), its route back, the future its upload resolves."""

    ref: Any
    route: ResultRoute
    arrived: asyncio.Future[Arrival]


class Training(KindHandler[TrainingSpec]):
    kind = JobKind.TRAINING

    def __init__(self, settings: HeadSettings, store: Store | None = None) -> None:
        super().__init__(settings, store)
        self.runs: dict[str, asyncio.Task[None]] = {}  # job id → its driving task

    def plan(self, spec: TrainingSpec, submission: Submission) -> Plan:
        """Shards are stretches of steps between checkpoints; items are samples."""
        items = submission.items
        if items < 1:
            raise SpecError("the dataset is empty")
        if spec.batch_size > items:
            raise SpecError(f"batch_size {spec.batch_size} is larger than the dataset ({items} items)")
        check_model_files(spec, submission.names)
        steps = spec.training.total_steps(items, spec.batch_size)
        every = spec.training.checkpoint_every
        if steps > MAX_STEPS:
            raise SpecError(f"training: {steps:,} steps: at most {MAX_STEPS:,}")
        if -(-steps // every) > MAX_SHARDS:  # each stretch is a shard: a row, a file and a checkpoint
            raise SpecError(f"training: {steps:,} steps with checkpoint_every {every} make {-(-steps // every):,} "
                            f"stretches: at most {MAX_SHARDS:,} (a larger checkpoint_every)")
        ranges = [(start, min(start + every, steps)) for start in range(0, steps, every)]
        return Plan(steps * spec.batch_size, ranges, model_key(spec, submission.code_zip))

    def schedule(self, job: Job, spec: TrainingSpec, driver: Driver) -> None:
        """Drive the job unless it is driven already."""
        if job.id not in self.runs:
            task = asyncio.create_task(Run(self, job.id, spec, driver).drive())
            self.runs[job.id] = task
            task.add_done_callback(lambda _: self.runs.pop(job.id, None))

    def cancel(self, job_id: str) -> None:
        task = self.runs.get(job_id)
        if task is not None:
            task.cancel()

    def finish(self, job: Job, spec: TrainingSpec, metrics: dict[str, float]) -> dict[str, Any]:
        """model.pt: the last checkpoint's model weights (a state_dict)."""
        import torch  # the head has torch with the worker extra
        from safetensors.torch import load_file

        output = Path(job.output)
        last = max(s.stop for s in job.shards)
        final = checkpoint_path(output, last)
        tensors = load_file(final)  # made on a node: safetensors, tensors only, no code
        buffer = io.BytesIO()
        torch.save({name.removeprefix("model."): value for name, value in tensors.items()
                    if name.startswith("model.")}, buffer)
        atomic_write(output / MODEL, buffer.getvalue())
        return {"model": MODEL, "steps": last, "samples": job.items, "checkpoint": str(final.relative_to(output))}


class Run:
    """One training job driven from start to end (or to its failure or cancel)."""

    def __init__(self, handler: Training, job_id: str, spec: TrainingSpec, driver: Driver) -> None:
        self.handler = handler
        self.job_id = job_id
        self.spec = spec
        self.driver = driver
        self.store = driver.store
        self.outcomes = driver.outcomes
        self.calls: list[Call] = []  # the calls of the workers now running, whose tickets go when they stop

    async def drive(self) -> None:
        fruitless = 0  # starts in a row that trained no stretch: a stretch's attempts count only once it runs
        for left in (Path(self.store.job(self.job_id).output) / "checkpoints").glob(".incoming-*"):
            left.unlink(missing_ok=True)  # what workers were sending when a head before this one died
        try:
            while True:
                job = self.store.job(self.job_id)
                if job.state.finished:
                    return
                pending = [s for s in job.shards if s.state is not ShardState.SUCCEEDED]
                if not pending:
                    self.outcomes.finish_if_done(job.id, self.handler, self.spec)
                    return
                if fruitless > self.driver.settings.max_attempts:
                    self.outcomes.fail(job.id, None,
                                       f"training could not start after {fruitless} tries: {pending[0].error}")
                    return
                try:
                    fruitless = 0 if await self._run_workers(job) else fruitless + 1
                except NoWorkers as exc:
                    self._explain(f"waiting for workers: {exc}")
                    await asyncio.sleep(WATCH_S)
        except Exception as exc:  # the driver itself broke: say so on the job rather than lose it silently
            if not isinstance(exc, FarmError):
                log.exception("training job %s", self.job_id)
            self.outcomes.fail(self.job_id, None, sort_failure(exc).message)

    async def _run_workers(self, job: Job) -> bool:
        """Start workers and train stretches until the job is done or a worker is lost; whether any stretch
        finished."""
        spec = self.spec
        first = next(s for s in job.shards if s.state is not ShardState.SUCCEEDED)
        checkpoint = self._checkpoint(job, first.start)
        # Trusted nodes only: training's workers are Ray actors in one collective group on the head's Ray, which a
        # lent node never joins (README, Security).
        nodes = {n.id: n for n in self.store.nodes() if n.trusted}
        if not nodes:
            raise NoWorkers("training runs on trusted nodes only (`farm agent start --trusted`): lent nodes never "
                            "join the head's Ray")
        request = ShardRequest(
            job_id=job.id, index=first.index, items=spec.batch_size, backends=spec.backends, policy=spec.policy,
            peak_bytes={BackendName(b): n for b, n in self.store.peak_memory(job.model_key).items()},
            model_bytes=job.model_bytes,
        )
        chosen = choose_workers(request, list(nodes.values()), min(spec.training.workers, spec.batch_size),
                                calibration.rates(self.store.samples(job.model_key), basis=spec.energy))
        group = new_id(f"farm-{job.id}")  # fresh per start: a failed start may leave its rendezvous key behind
        nccl = all(BACKENDS[a.backend].nccl for a in chosen)
        runtime_env = environment.runtime_env(spec, self.driver.working_dir(job))
        actors = [
            remote.TrainWorker.options(
                **remote.pinned(a.node_id, a.backend.value, runtime_env, f"farm:{job.name}:rank{rank}:{group}"),
            ).remote(job.spec_yaml, job.id, rank, len(chosen), group, a.device, a.threads, checkpoint, nccl)
            for rank, a in enumerate(chosen)
        ]
        names = [f"{nodes[a.node_id].name}/{a.device}" for a in chosen]
        workers = nodes[chosen[0].node_id].model_copy(update={"name": " + ".join(names)})  # stretches' "node"
        trained = False
        self.calls = []
        try:
            await self._watch(chosen, self._calls(actors, "join"))
            probed = await self._watch(chosen, self._calls(actors, "probe", max(spec.batch_size // len(chosen), 1)))
            speeds = [max(figures(a).metrics.get("speed", 0.0), 0.0) for a in probed]
            shares = batch_shares(spec.batch_size, speeds)
            self._log("workers: " + ", ".join(
                f"{n} ({s:,.0f} samples/s measured, {share} of each batch of {spec.batch_size})"
                for n, s, share in zip(names, speeds, shares)) + (f"; resuming at step {first.start}"
                                                                  if first.start else ""))
            self._explain("\n".join(f"{n}: {a.basis}" for n, a in zip(names, chosen)))
            for stretch in [s for s in job.shards if s.state is not ShardState.SUCCEEDED]:
                shares = await self._stretch(job, stretch.index, chosen, actors, names, shares, workers)
                trained = True
        except Exception as exc:
            failure = sort_failure(exc, collective=True)
            if not failure.node and not isinstance(exc, Uploaded):
                raise  # the head's own failure: drive() fails the job
            index = next(s.index for s in self.store.job(job.id).shards if s.state is not ShardState.SUCCEEDED)
            if isinstance(exc, Uploaded) and not failure.node:
                joblog.record_failure(self.store, job.id, index, exc.log, exc.trace)
            self.outcomes.failed(job.id, index, failure)
        finally:
            for call in self.calls:
                self.driver.forget(call.route)
                if call.arrived.done() and not call.arrived.cancelled():
                    call.arrived.result().discard()
            for actor in actors:
                ray.kill(actor, no_restart=True)
        return trained

    def _calls(self, actors: list[Any], method: str, *args: Any, staging: bool = False) -> list[Call]:
        """`method` called on every worker in `actors`, each with its own upload ticket; `staging`: it sends a table
        or a file, kept in the job's checkpoints folder until taken."""
        calls = []
        for actor in actors:
            route, arrived = self.driver.expect(self._staging() if staging else None)
            calls.append(Call(actor.call.remote(route, method, *args), route, arrived))
        self.calls.extend(calls)
        return calls

    def _staging(self) -> Path:
        folder = Path(self.store.job(self.job_id).output) / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=folder, prefix=".incoming-")
        os.close(fd)
        return Path(path)

    async def _stretch(self, job: Job, index: int, chosen: list[Assignment], actors: list[Any],
                       names: list[str], shares: list[int], workers: Node) -> list[int]:
        """Train one stretch on every worker; record it; return the batch split for the next one."""
        spec = self.spec
        stretch = self.store.job(job.id).shards[index]
        self.outcomes.started(job, index, workers, chosen[0].backend.value, chosen[0].device, f"split {shares}")
        trained = await self._watch(chosen, self._calls(actors, "train", stretch.start, stretch.stop, shares,
                                                        staging=True))
        losses = await asyncio.to_thread(_losses, trained[0])
        if len(losses) != stretch.stop - stretch.start:
            raise FarmError(f"a training worker sent {len(losses)} losses for {stretch.stop - stretch.start} steps")
        for arrival in trained:
            arrival.discard()
        results = [figures(a) for a in trained]
        (state,) = await self._watch(chosen[:1], self._calls(actors[:1], "state", staging=True))
        if state.table is None:
            raise FarmError("a training worker sent no checkpoint")
        await asyncio.to_thread(os.replace, state.table.path, checkpoint_path(Path(job.output), stretch.stop))
        eval_dataset = spec.training.eval_dataset
        scores: dict[str, float] = {}
        if eval_dataset:
            (scored,) = await self._watch(chosen[:1], self._calls(actors[:1], "evaluate", eval_dataset))
            scores = dict(figures(scored).metrics)
        for name, result in zip(names, results):  # what each worker printed, as a shard's output
            joblog.record_worker_output(self.store, job.id, index, name, result.log)
        for step, loss in enumerate(losses, start=stretch.start + 1):
            self._log(f"step {step}: loss {loss:.4f}")
        energy = energy_sum([r.energy for r in results])
        computed = [r.metrics.get("compute_s", 0.0) for r in results]
        speeds = [r.items / c if c > 0 else 0.0 for r, c in zip(results, computed)]
        self._log(f"steps {stretch.start + 1}-{stretch.stop}: " + ", ".join(
            f"{n} {r.items / r.seconds if r.seconds > 0 else 0.0:,.0f} samples/s" for n, r in zip(names, results))
            + (f"; {energy.joules:,.1f} J ({energy.source.value})" if energy else "")
            + "".join(f"; {k} {v:.4f}" for k, v in scores.items()))
        self.store.set_metrics(job.id, {"step": stretch.stop, "loss": losses[-1], **scores})
        self.outcomes.succeeded(job.id, index, ShardRecord(sum(r.items for r in results),
                                                           max(r.seconds for r in results), None, energy))
        _prune_checkpoints(Path(job.output), keep=stretch.stop)
        if spec.training.sync is SyncMode.SYNC and all(s > 0 for s in speeds):
            return batch_shares(spec.batch_size, speeds)  # the split follows what each worker just did
        return shares

    async def _watch(self, chosen: list[Assignment], calls: list[Call]) -> list[Arrival]:
        """Every call's result, as its upload arrives; a failure one sends stops the stretch (Uploaded), and so does a
        worker's node that leaves the farm or a call whose task ended with no result (its worker died): its peers
        would otherwise wait in a collective for a partner that is gone."""
        pending: set[asyncio.Future[Arrival]] = {c.arrived for c in calls}
        while pending:
            done, pending = await asyncio.wait(pending, timeout=WATCH_S, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                arrival = future.result()
                if arrival.failure is not None:
                    raise Uploaded(arrival.failure, arrival.log, arrival.traceback)
            if not pending:
                break
            states = {n.id: n.state for n in self.store.node_liveness()}  # the light read: offline nodes are absent
            # A draining node keeps its workers while its Ray worker runs: only a node that is neither has left.
            lost = [a for a in chosen if states.get(a.node_id) not in (NodeState.READY, NodeState.DRAINING)]
            if lost:
                raise NodeLost(f"node {lost[0].node_id} left the farm")
            waiting = [c for c in calls if not c.arrived.done()]
            ended, _ = await asyncio.to_thread(ray.wait, [c.ref for c in waiting], num_returns=len(waiting),
                                               timeout=0, fetch_local=False)
            # An ended call whose result is in had it in before its task ended (the upload's reply comes first).
            if any(not c.arrived.done() for c in waiting if c.ref in set(ended)):
                raise NodeLost("a training worker's call ended with no result: its worker or node failed")
        return [c.arrived.result() for c in calls]

    def _checkpoint(self, job: Job, step: int) -> Any:
        """The checkpoint to resume at `step` from (in Ray's object store), or None at step 0."""
        if step == 0:
            return None
        path = checkpoint_path(Path(job.output), step)
        if not path.is_file():
            raise FarmError(f"no checkpoint for step {step} at {path}: training cannot resume")
        return ray.put(path.read_bytes())

    def _log(self, message: str) -> None:
        self.store.log(self.job_id, "info", message)

    def _explain(self, text: str) -> None:
        if text != self.store.job(self.job_id).explanation:
            self.store.set_explanation(self.job_id, text)


def _losses(arrival: Arrival) -> list[float]:
    """A stretch's losses, step by step, from the table its rank 0 sent."""
    column = arrival.table.column("loss") if arrival.table is not None else None
    if column is None or not pa.types.is_floating(column.type):
        raise FarmError("a training worker sent no losses")
    return [float(x) for x in column.to_pylist()]


def _prune_checkpoints(output: Path, keep: int) -> None:
    """Keep the checkpoint just written and the one before it."""
    found = sorted((output / "checkpoints").glob("step-*.safetensors"))
    for path in found[:-2]:
        if path != checkpoint_path(output, keep):
            path.unlink(missing_ok=True)



