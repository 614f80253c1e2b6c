"""The training driver: runs a `kind: training` job's workers on the cluster, from checkpoint to checkpoint.

A training job's shards are stretches of steps between checkpoints ([start, stop) in steps). For each start (and
each resume) the driver picks the workers (`farm.scheduler.training`), starts one Ray actor per device
(`farm_agent.trainer.TrainWorker`, pinned by node label like inference shards), joins them in a collective group,
measures their speed and splits the global batch by it. Then each stretch: train, take rank 0's state as the
checkpoint (written atomically, named by its step), score it on the eval set, record the stretch like a shard
(seconds, samples, energy), and re-split the batch by the speeds just measured.

Whatever stops a stretch (a node lost, a worker crashed, the head restarted) sends it back to pending; the next
start resumes from the checkpoint at that stretch's first step, with the nodes that remain.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray import exceptions as ray_errors

from farm.core.errors import FarmError
from farm.core.ids import new_id
from farm.core.models import BackendName, JobState, Node, NodeState, ShardState
from farm.core.spec import JobSpec, SyncMode, parse_spec
from farm.head.output import write_manifest
from farm.head.settings import HeadSettings
from farm.head.store import Job, Store
from farm.scheduler import ShardRequest, calibration
from farm.scheduler.training import NoWorkers, batch_shares, choose_workers
from farm.scheduler.types import Assignment
from farm_agent.trainer import TrainWorker, energy_sum

log = logging.getLogger("farm.head")

NODE_LABEL = "farm.io/node"
RemoteTrainWorker = ray.remote(num_cpus=0, max_restarts=0)(TrainWorker)
# Failures of a worker's node or process, not of the job's code: the stretch goes back to pending.
WORKER_FAILURES = (ray_errors.RayActorError, ray_errors.NodeDiedError, ray_errors.WorkerCrashedError,
                   ray_errors.ObjectLostError, ray_errors.OutOfMemoryError, ray_errors.LocalRayletDiedError)
# How often a running stretch looks at its workers' nodes, in seconds.
WATCH_S = 1.0


class WorkerLost(Exception):
    pass


def checkpoint_path(output: Path, step: int) -> Path:
    return output / "checkpoints" / f"step-{step:08d}.pt"


class TrainingDriver:
    def __init__(self, store: Store, settings: HeadSettings, notify: Callable[[str], None],
                 working_dir: Callable[[Job], str]) -> None:
        self.store = store
        self.settings = settings
        self.notify = notify
        self.working_dir = working_dir
        self.runs: dict[str, asyncio.Task[None]] = {}

    def ensure(self, job: Job) -> None:
        """Drive `job` unless it is driven already (called every dispatcher round)."""
        if job.id not in self.runs:
            task = asyncio.create_task(self._drive(job.id))
            self.runs[job.id] = task
            task.add_done_callback(lambda _: self.runs.pop(job.id, None))

    def cancel(self, job_id: str) -> None:
        task = self.runs.get(job_id)
        if task is not None:
            task.cancel()

    async def _drive(self, job_id: str) -> None:
        fruitless = 0  # starts in a row that trained no stretch: a stretch's attempts count only once it runs
        try:
            while True:
                job = self.store.job(job_id)
                if job.state.finished:
                    return
                spec = parse_spec(job.spec_yaml, job.id)
                pending = [s for s in job.shards if s.state is not ShardState.SUCCEEDED]
                if not pending:
                    self._finish(job)
                    return
                if fruitless > self.settings.max_attempts:
                    self._fail(job_id, f"training could not start after {fruitless} tries: {pending[0].error}")
                    return
                try:
                    fruitless = 0 if await self._run_workers(job, spec) else fruitless + 1
                except NoWorkers as exc:
                    self._explain(job, f"waiting for workers: {exc}")
                    await asyncio.sleep(WATCH_S)
        except FarmError as exc:
            self._fail(job_id, exc.message)
        except Exception as exc:  # the driver itself broke: say so on the job rather than lose it silently
            log.exception("training job %s", job_id)
            self._fail(job_id, f"head: {type(exc).__name__}: {exc}")

    async def _run_workers(self, job: Job, spec: JobSpec) -> bool:
        """Start workers and train stretches until the job is done or a worker is lost; whether any stretch
        finished."""
        training = spec.training
        assert training is not None  # parse_spec: kind training has its section
        first = next(s for s in job.shards if s.state is not ShardState.SUCCEEDED)
        checkpoint = self._checkpoint(job, first.start)
        nodes = {n.id: n for n in self.store.nodes()}
        request = ShardRequest(
            job_id=job.id, index=first.index, items=spec.batch_size, backends=spec.backends, policy=spec.policy,
            peak_bytes={BackendName(b): n for b, n in self.store.peak_memory(job.model_key).items()},
            model_bytes=job.model_bytes,
        )
        chosen = choose_workers(request, list(nodes.values()), min(training.workers, spec.batch_size),
                                calibration.rates(self.store.samples(job.model_key)))
        group = new_id(f"farm-{job.id}")  # fresh per start: a failed start may leave its rendezvous key behind
        nccl = all(a.backend is BackendName.CUDA for a in chosen)
        actors = [
            RemoteTrainWorker.options(  # type: ignore[attr-defined]
                label_selector={NODE_LABEL: a.node_id}, resources={f"farm.{a.backend.value}": 1},
                runtime_env={"working_dir": self.working_dir(job)}, name=f"farm:{job.name}:rank{rank}:{group}",
            ).remote(job.spec_yaml, job.id, rank, len(chosen), group, a.device, a.threads, checkpoint, nccl)
            for rank, a in enumerate(chosen)
        ]
        names = [f"{nodes[a.node_id].name}/{a.device}" for a in chosen]
        workers = nodes[chosen[0].node_id].model_copy(update={"name": " + ".join(names)})  # stretches' "node"
        trained = False
        try:
            await self._watch(chosen, [a.join.remote() for a in actors])
            speeds = await self._watch(chosen, [a.probe.remote(max(spec.batch_size // len(chosen), 1))
                                                for a in actors])
            shares = batch_shares(spec.batch_size, speeds)
            self._log(job.id, "workers: " + ", ".join(
                f"{n} ({s:,.0f} samples/s measured, {share} of each batch of {spec.batch_size})"
                for n, s, share in zip(names, speeds, shares)) + (f"; resuming at step {first.start}"
                                                                  if first.start else ""))
            self._explain(job, "\n".join(f"{n}: {a.basis}" for n, a in zip(names, chosen)))
            for stretch in [s for s in job.shards if s.state is not ShardState.SUCCEEDED]:
                shares = await self._stretch(job, spec, stretch.index, chosen, actors, names, shares, workers)
                trained = True
        except WORKER_FAILURES + (WorkerLost,) as exc:
            index = next(s.index for s in self.store.job(job.id).shards if s.state is not ShardState.SUCCEEDED)
            self._requeue_or_fail(job.id, index, f"{type(exc).__name__}: {_first_line(exc)}")
        except ray_errors.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            message = cause.message if isinstance(cause, FarmError) else f"{type(cause).__name__}: {_first_line(cause)}"
            if _peer_lost(message):  # a survivor's collective broke because a partner vanished: not the job's fault
                index = next(s.index for s in self.store.job(job.id).shards if s.state is not ShardState.SUCCEEDED)
                self._requeue_or_fail(job.id, index, message)
            else:
                self._fail(job.id, message)
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)
        return trained

    async def _stretch(self, job: Job, spec: JobSpec, index: int, chosen: list[Assignment], actors: list[Any],
                       names: list[str], shares: list[int], workers: Node) -> list[int]:
        """Train one stretch on every worker; record it; return the batch split for the next one."""
        training = spec.training
        assert training is not None
        stretch = self.store.job(job.id).shards[index]
        self.store.shard_started(job.id, index, workers, chosen[0].backend.value, chosen[0].device,
                                 f"split {shares}")
        if self.store.job(job.id).state is JobState.QUEUED:
            self.store.set_job_state(job.id, JobState.RUNNING)
        self.notify(job.id)
        results = await self._watch(chosen, [a.train.remote(stretch.start, stretch.stop, shares) for a in actors])
        state: bytes = await actors[0].state.remote()
        await asyncio.to_thread(_write_atomic, checkpoint_path(Path(job.output), stretch.stop), state)
        scores = await actors[0].evaluate.remote(training.eval_dataset) if training.eval_dataset else {}
        losses = results[0]["losses"]
        for step, loss in enumerate(losses, start=stretch.start + 1):
            self._log(job.id, f"step {step}: loss {loss:.4f}")
        energy = energy_sum([r["energy"] for r in results])
        speeds = [r["items"] / r["compute_s"] if r["compute_s"] > 0 else 0.0 for r in results]
        self._log(job.id, f"steps {stretch.start + 1}-{stretch.stop}: " + ", ".join(
            f"{n} {r['items'] / r['seconds']:,.0f} samples/s" for n, r in zip(names, results))
            + (f"; {energy.joules:,.1f} J ({energy.source.value})" if energy else "")
            + "".join(f"; {k} {v:.4f}" for k, v in scores.items()))
        self.store.shard_succeeded(job.id, index, sum(r["items"] for r in results),
                                   max(r["seconds"] for r in results), None, energy)
        self.store.set_metrics(job.id, {"step": stretch.stop, "loss": losses[-1], **scores})
        self._prune_checkpoints(Path(job.output), keep=stretch.stop)
        self.notify(job.id)
        if training.sync is SyncMode.SYNC and all(s > 0 for s in speeds):
            return batch_shares(spec.batch_size, speeds)  # the split follows what each worker just did
        return shares

    async def _watch(self, chosen: list[Assignment], refs: list[Any]) -> list[Any]:
        """Await every worker's call; a worker's node that leaves the farm stops the stretch at once (its peers
        would otherwise wait in a collective for a partner that is gone)."""
        pending = {asyncio.ensure_future(_awaitable(ref)) for ref in refs}
        futures = list(pending)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=WATCH_S, return_when=asyncio.FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    raise future.exception()  # type: ignore[misc]
            states = {n.id: n.state for n in self.store.node_liveness()}  # the light read: offline nodes are absent
            # A draining node keeps its workers while its Ray worker runs: only a node that is neither has left.
            lost = [a for a in chosen if states.get(a.node_id) not in (NodeState.READY, NodeState.DRAINING)]
            if lost and pending:
                raise WorkerLost(f"node {lost[0].node_id} left the farm")
        return [f.result() for f in futures]

    def _checkpoint(self, job: Job, step: int) -> Any:
        """The checkpoint to resume at `step` from (in Ray's object store), or None at step 0."""
        if step == 0:
            return None
        path = checkpoint_path(Path(job.output), step)
        if not path.is_file():
            raise FarmError(f"no checkpoint for step {step} at {path}: training cannot resume")
        return ray.put(path.read_bytes())

    def _prune_checkpoints(self, output: Path, keep: int) -> None:
        """Keep the checkpoint just written and the one before it."""
        found = sorted((output / "checkpoints").glob("step-*.pt"))
        for path in found[:-2]:
            if path != checkpoint_path(output, keep):
                path.unlink(missing_ok=True)

    def _finish(self, job: Job) -> None:
        output = Path(job.output)
        last = max(job.shards, key=lambda s: s.stop)
        final = checkpoint_path(output, last.stop)
        import torch  # the head has torch with the worker extra; only the model's weights go to model.pt

        state = torch.load(final, map_location="cpu", weights_only=False)
        buffer_path = output / "model.pt.tmp"
        torch.save(state["model"], buffer_path)
        os.replace(buffer_path, output / "model.pt")
        wall_s = time.time() - job.started_at
        metrics = {**job.metrics, "items_per_s": job.items / wall_s if wall_s > 0 else 0.0, "wall_s": wall_s}
        if job.energy_j > 0 and all(s.energy_source for s in job.shards):
            metrics["items_per_j"] = job.items / job.energy_j
        self.store.set_metrics(job.id, metrics)
        write_manifest(output, {
            "job_id": job.id, "name": job.name, "kind": "training", "model": "model.pt", "steps": last.stop,
            "samples": job.items, "metrics": metrics, "checkpoint": str(final.relative_to(output)),
            "stretches": [{"index": s.index, "steps": [s.start, s.stop], "workers": s.node_name,
                           "seconds": s.seconds, "energy_j": s.energy_j, "energy_source": s.energy_source}
                          for s in job.shards],
        })
        self.store.set_job_state(job.id, JobState.SUCCEEDED)
        self.notify(job.id)

    def _requeue_or_fail(self, job_id: str, index: int, error: str) -> None:
        job = self.store.job(job_id)
        if job.state.finished:
            return
        if job.shards[index].state is ShardState.RUNNING and job.shards[index].attempts >= self.settings.max_attempts:
            self._fail(job_id, f"steps {job.shards[index].start}-{job.shards[index].stop}: {error} "
                               f"(after {job.shards[index].attempts} attempts)")
            return
        self.store.shard_requeued(job_id, index, error)
        self.notify(job_id)

    def _fail(self, job_id: str, error: str) -> None:
        if not self.store.job(job_id).state.finished:
            self.store.set_job_state(job_id, JobState.FAILED, error)
            self.notify(job_id)

    def _log(self, job_id: str, message: str) -> None:
        self.store.log(job_id, "info", message)

    def _explain(self, job: Job, text: str) -> None:
        if text != self.store.job(job.id).explanation:
            self.store.set_explanation(job.id, text)


async def _awaitable(ref: Any) -> Any:
    return await ref


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# What a collective raises on the workers that remain when one of the group dies (gloo's TCP pairs, NCCL).
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "gloo/transport", "NCCL communicator")


def _peer_lost(message: str) -> bool:
    return any(sign in message for sign in PEER_LOST)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

