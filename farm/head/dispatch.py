"""The Ray driver: turns the scheduler's placements into Ray tasks pinned to nodes, and their results into state.

Runs on the head's event loop. Blocking Ray calls (cluster state) go to a thread; task results are awaited.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import exceptions as ray_errors
from ray._private.runtime_env import packaging

from farm.core.errors import FarmError
from farm.core.kernels import KernelEvalShardResult
from farm.core.models import BackendName, JobState, Node, NodeState, ShardState
from farm.core.spec import JobKind, JobSpec, parse_spec
from farm.core.tasks import ShardResult, ShardTask, Tuning
from farm.head import kernel_jobs
from farm.head.output import remove_partial_files, shard_file, write_manifest, write_shard
from farm.head.liveness import derive_state
from farm.head.settings import HeadSettings
from farm.head.store import Job, Store
from farm.head.training import TrainingDriver
from farm.scheduler import Assignment, ShardRequest, calibration
from farm.scheduler.rounds import schedule_round
from farm_agent.kernel_eval import run_kernel_shard
from farm_agent.runner import run_shard

log = logging.getLogger("farm.head")

NODE_LABEL = "farm.io/node"
# Failures of the place a shard ran, not of the job's code: the shard goes back to the queue.
NODE_FAILURES = (
    ray_errors.NodeDiedError, ray_errors.WorkerCrashedError, ray_errors.ObjectLostError,
    ray_errors.OutOfMemoryError, ray_errors.LocalRayletDiedError,
)
# The remote shard runner; Ray pickles it by reference, so the nodes import it from their own farm_agent.
remote_run_shard = ray.remote(num_cpus=0, max_retries=0)(run_shard)
remote_run_kernel_shard = ray.remote(num_cpus=0, max_retries=0)(run_kernel_shard)


@dataclass
class Running:
    node_id: str
    device: str
    ref: Any


class Dispatcher:
    def __init__(self, store: Store, settings: HeadSettings, notify: Callable[[str], None]) -> None:
        self.store = store
        self.settings = settings
        self.notify = notify
        self.wake = asyncio.Event()
        self.running: dict[tuple[str, int], Running] = {}
        self.draining: set[str] = set()  # as of the last refresh_nodes: nodes whose owner or operator drains them
        self.code: dict[str, str] = {}  # job id → the URI of its code package in Ray
        self.tasks: set[asyncio.Task[None]] = set()
        self.training = TrainingDriver(store, settings, notify, self._working_dir)

    async def run(self) -> None:
        self.recover()
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            await self.refresh_nodes()
            self.schedule()

    def recover(self) -> None:
        """After a head restart (a crash included): shards that were running died with the old Ray driver and go
        back to the queue; files a killed head was writing are removed (the shards they belong to run again); a job
        whose last shard was recorded just before the head died gets its manifest now."""
        requeued = self.store.requeue_running()
        if requeued:
            log.info("recovered %d shards that were running when the head stopped", requeued)
        for job in self.store.jobs(states=(JobState.QUEUED, JobState.RUNNING)):
            if job.kind != JobKind.TRAINING.value:
                remove_partial_files(Path(job.output))
                self._finish_if_done(job.id)

    async def refresh_nodes(self) -> None:
        """Node state from heartbeats and from Ray's own view of its nodes."""
        ray_nodes = await asyncio.to_thread(ray.nodes)
        alive = {
            n["Labels"][NODE_LABEL]: n["NodeID"] for n in ray_nodes if n.get("Alive") and NODE_LABEL in n.get("Labels", {})
        }
        now = time.time()
        holding = set()  # nodes whose Ray worker runs: ready or draining, they keep their running shards
        draining = set()  # nodes their owner or an operator took out of the farm's hands
        for node in self.store.node_liveness():  # not store.nodes(): thousands of nodes, every second
            if node.state is NodeState.OFFLINE:  # it left or went silent; a heartbeat or Register brings it back
                continue
            if node.draining:
                draining.add(node.id)
            state = derive_state(node, node.id in alive, now - node.last_heartbeat, self.settings.offline_after_s)
            ray_id = alive[node.id] if state in (NodeState.READY, NodeState.DRAINING) else None
            if state is not node.state or (ray_id and ray_id != node.ray_node_id):
                log.info("node %s is %s", node.name, state.value)
                self.store.set_node_state(node.id, state, ray_id)
            if state in (NodeState.READY, NodeState.DRAINING):
                holding.add(node.id)
        self.draining = draining
        self._take_back_from_lost_nodes(holding, draining)

    def _take_back_from_lost_nodes(self, holding: set[str], draining: set[str]) -> None:
        """Shards on a node that left, went silent or lost its Ray worker go back to the queue.

        Ray fails a task whose node dies while it runs, but only once its own health checks notice; and a task
        still waiting there (its worker starting, its code unpacking) would wait forever for a node its label
        selector can no longer match. A draining node keeps its shards while its Ray worker runs; once its agent
        stops the worker (its owner stayed busy past the agent's grace), they go back to the queue without counting
        as a failed try: the shard did nothing wrong.
        """
        for key, running in list(self.running.items()):
            if running.node_id in holding:
                continue
            del self.running[key]
            ray.cancel(running.ref, force=True)
            if running.node_id in draining:
                self._requeue(*key, "its node drained and stopped its Ray worker")
            else:
                self._retry_or_fail(*key, "its node left the farm")
            self.notify(key[0])

    def schedule(self) -> None:
        """One round per unfinished job, in submission order: earlier jobs take free slots first."""
        jobs = self.store.jobs(states=(JobState.QUEUED, JobState.RUNNING))
        if not jobs:
            return
        nodes = {node.id: node for node in self.store.nodes()}
        busy = Counter((r.node_id, r.device) for r in self.running.values())
        for job in jobs:
            if job.kind == JobKind.TRAINING.value:  # its workers step together: driven from start to end apart
                self.training.ensure(job)
                continue
            spec = parse_spec(job.spec_yaml, job.id)
            peaks = {BackendName(b): n for b, n in self.store.peak_memory(job.model_key).items()}
            backends = spec.kernel_eval_backends if job.kind == JobKind.KERNEL_EVAL.value else spec.backends
            wanted = [
                ShardRequest(job_id=job.id, index=s.index, items=s.size, backends=backends, policy=spec.policy,
                             peak_bytes=peaks, model_bytes=job.model_bytes)
                for s in job.shards if s.state is ShardState.PENDING and (job.id, s.index) not in self.running
            ]
            if not wanted:
                continue
            running_items: Counter[tuple[str, str]] = Counter()
            for (job_id, index), running in self.running.items():
                if job_id == job.id:
                    running_items[(running.node_id, running.device)] += job.shards[index].size
            deadline = None if spec.deadline_s is None else spec.deadline_s - (time.time() - job.created_at)
            decided = schedule_round(wanted, list(nodes.values()), busy, running_items,
                                     calibration.rates(self.store.samples(job.model_key)), deadline, now=time.time())
            if decided.infeasible:
                self._cancel_running(job.id)
                self.store.set_job_state(job.id, JobState.FAILED, decided.infeasible)
                self.notify(job.id)
                continue
            for assignment in decided.assignments:
                busy[(assignment.node_id, assignment.device)] += 1
                self.launch(job, spec, assignment, nodes[assignment.node_id])
            waiting = sorted({f"waiting: {w.why}" for w in decided.waiting})
            explanation = "\n".join([*decided.explanation, *waiting])
            if explanation != job.explanation:
                self.store.set_explanation(job.id, explanation)

    def _working_dir(self, job: Job) -> str:
        """The job's code as a Ray package URI, uploaded once: Ray ships it to each node as the working_dir of the
        job's tasks, unpacks it once per node and gives each job's tasks worker processes of their own.

        Task-level runtime_envs take only URIs, not local paths, so the package is uploaded here with Ray's own
        packaging calls (pinned with ray==2.60), as `ray.init(runtime_env=...)` does for a whole driver.
        """
        if job.id not in self.code:
            data = Path(job.code_path).read_bytes()
            uri = f"gcs://_ray_pkg_{hashlib.sha1(data).hexdigest()}.zip"
            if not packaging.package_exists(uri):
                packaging.upload_package_to_gcs(uri, data)
            self.code[job.id] = uri
        return self.code[job.id]

    def launch(self, job: Job, spec: JobSpec, assignment: Assignment, node: Node) -> None:
        shard = job.shards[assignment.index]
        if spec.kind is JobKind.KERNEL_EVAL:
            task: object = kernel_jobs.task(job, spec, shard.index, assignment.backend.value, assignment.device)
            remote = remote_run_kernel_shard
        else:
            task = ShardTask(
                job_id=job.id, index=shard.index, start=shard.start, stop=shard.stop, model=spec.model or "",
                weights=spec.weights, dataset=spec.dataset or "", batch_size=spec.batch_size,
                backend=assignment.backend.value, device=assignment.device, threads=assignment.threads,
                tuning=Tuning(atol=spec.tolerance.atol, rtol=spec.tolerance.rtol, budget_s=spec.tune_budget_s),
            )
            remote = remote_run_shard
        ref = remote.options(
            label_selector={NODE_LABEL: node.id},
            resources={f"farm.{assignment.backend.value}": 1},
            runtime_env={"working_dir": self._working_dir(job)},
            name=f"farm:{job.name}:{shard.index}",
        ).remote(task)
        self.running[(job.id, shard.index)] = Running(node.id, assignment.device, ref)
        self.store.shard_started(job.id, shard.index, node, assignment.backend.value, assignment.device,
                                 f"score {assignment.score:,.1f}, {assignment.basis}")
        if job.state is JobState.QUEUED:
            self.store.set_job_state(job.id, JobState.RUNNING)
            job.state = JobState.RUNNING
        self.notify(job.id)
        watcher = asyncio.create_task(self._collect(job.id, shard.index, self.running[(job.id, shard.index)]))
        self.tasks.add(watcher)
        watcher.add_done_callback(self.tasks.discard)

    async def _collect(self, job_id: str, index: int, running: Running) -> None:
        key = (job_id, index)
        try:
            result: ShardResult | KernelEvalShardResult = await running.ref
            if self.running.get(key) is not running:  # taken back meanwhile: a rerun owns the shard now
                return
            # Claimed before the first await: the result is here, so losing its node while the file is written must
            # not hand the shard to another node (a second result, a second write).
            del self.running[key]
            job = self.store.job(job_id)
            if job.state.finished:  # cancelled, or failed by another shard
                return
            if isinstance(result, KernelEvalShardResult):  # its rows, named by the node that measured them
                await asyncio.to_thread(kernel_jobs.write_rows, Path(job.output), index, result.rows,
                                        job.shards[index].node_name)
            else:
                await asyncio.to_thread(write_shard, Path(job.output), index, result.outputs)
            self.store.shard_succeeded(job_id, index, result.items, result.seconds, result.correct, result.energy,
                                       result.peak_memory_bytes)
            self._finish_if_done(job_id)
        except ray_errors.TaskCancelledError:
            pass
        except NODE_FAILURES as exc:
            if self.running.get(key) is running and running.node_id in self.draining:  # its agent stopped Ray
                self._requeue(job_id, index, f"its node drained ({type(exc).__name__})")
            elif self.running.get(key) is running:
                self._retry_or_fail(job_id, index, f"{type(exc).__name__}: {_first_line(exc)}")
        except ray_errors.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            message = cause.message if isinstance(cause, FarmError) else f"{type(cause).__name__}: {_first_line(cause)}"
            self._fail(job_id, index, message)
        except Exception as exc:  # the head itself failed at writing the output: the job cannot finish
            log.exception("shard %s/%d", job_id, index)
            self._fail(job_id, index, f"head: {type(exc).__name__}: {exc}")
        finally:
            if self.running.get(key) is running:
                del self.running[key]
            self.notify(job_id)
            self.wake.set()

    def _retry_or_fail(self, job_id: str, index: int, error: str) -> None:
        job = self.store.job(job_id)
        if job.state.finished:
            return
        if job.shards[index].attempts < self.settings.max_attempts:
            self.store.shard_requeued(job_id, index, error)
        else:
            self._fail(job_id, index, f"{error} (after {job.shards[index].attempts} attempts)")

    def _requeue(self, job_id: str, index: int, error: str) -> None:
        if not self.store.job(job_id).state.finished:
            self.store.shard_requeued(job_id, index, error)

    def _fail(self, job_id: str, index: int, error: str) -> None:
        if self.store.job(job_id).state.finished:
            return
        self.store.shard_failed(job_id, index, error)
        self._cancel_running(job_id)
        self.store.set_job_state(job_id, JobState.FAILED, f"shard {index}: {error}")

    def cancel(self, job_id: str) -> None:
        self._cancel_running(job_id)
        self.training.cancel(job_id)
        self.store.set_job_state(job_id, JobState.CANCELLED)
        self.notify(job_id)

    def _cancel_running(self, job_id: str) -> None:
        for (running_job, _), running in list(self.running.items()):
            if running_job == job_id:
                ray.cancel(running.ref, force=True)

    def _finish_if_done(self, job_id: str) -> None:
        job = self.store.job(job_id)
        if any(s.state is not ShardState.SUCCEEDED for s in job.shards):
            return
        metrics = job_metrics(job)
        self.store.set_metrics(job_id, metrics)
        if job.kind == JobKind.KERNEL_EVAL.value:  # the results table, then its manifest
            kernel_jobs.finish(Path(job.output), job, metrics)
        else:
            write_manifest(Path(job.output), manifest(job, metrics))
        self.store.set_job_state(job_id, JobState.SUCCEEDED)
        self.code.pop(job_id, None)


def job_metrics(job: Job) -> dict[str, float]:
    """Rates over the job's wall time, from its first shard's start, as a user waiting on it sees them."""
    wall_s = time.time() - job.started_at
    metrics = {"items_per_s": job.items / wall_s if wall_s > 0 else 0.0, "wall_s": wall_s}
    if job.energy_j > 0 and all(s.energy_source for s in job.shards):
        metrics["items_per_j"] = job.items / job.energy_j
    if job.correct is not None:
        metrics["accuracy"] = job.correct / job.items
    return metrics


def manifest(job: Job, metrics: dict[str, float]) -> dict[str, Any]:
    return {
        "job_id": job.id, "name": job.name, "items": job.items, "metrics": metrics, "format": "npy",
        "shards": [
            {"index": s.index, "start": s.start, "stop": s.stop, "file": shard_file(s.index), "node": s.node_name,
             "backend": s.backend, "seconds": s.seconds, "energy_j": s.energy_j, "energy_source": s.energy_source,
             "energy_scope": s.energy_scope}
            for s in job.shards
        ],
    }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
