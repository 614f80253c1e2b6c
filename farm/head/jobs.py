"""Job intake and queries: what JobService does, apart from the wire."""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

from farm.core.errors import ConflictError, SpecError
from farm.core.ids import new_id
from farm.core.spec import JobKind, JobSpec, parse_spec, shard_ranges
from farm.head import kernel_jobs
from farm.head.dispatch import Dispatcher
from farm.head.events import JobEvents
from farm.head.settings import HeadSettings
from farm.head.store import Job, Store
from farm.local import write_private


class Jobs:
    def __init__(self, store: Store, dispatcher: Dispatcher, events: JobEvents, settings: HeadSettings) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.events = events
        self.settings = settings

    def submit(self, spec_yaml: str, code_zip: bytes, items: int, output: str, model_bytes: int = 0) -> str:
        """Validate, then persist the job, its code and its shards before anyone is told it exists."""
        spec = parse_spec(spec_yaml, "spec")
        if spec.kind is JobKind.KERNEL_EVAL:  # items are (problem, candidate) pairs, found in the code itself
            pairs, ranges = kernel_jobs.plan(spec, _zip_names(code_zip))
            items = len(pairs)
        if items < 1:
            raise SpecError("the dataset is empty")
        if spec.kind is not JobKind.KERNEL_EVAL:
            ranges = shard_ranges(items, spec.shards)
        if spec.training is not None:  # shards are stretches of steps between checkpoints; items are samples
            if spec.batch_size > items:
                raise SpecError(f"batch_size {spec.batch_size} is larger than the dataset ({items} items)")
            steps = spec.training.total_steps(items, spec.batch_size)
            every = spec.training.checkpoint_every
            ranges = [(start, min(start + every, steps)) for start in range(0, steps, every)]
            items = steps * spec.batch_size
        if len(code_zip) > self.settings.max_code_mb * 1024 * 1024:
            raise SpecError(f"the job's code is over {self.settings.max_code_mb} MB zipped")
        names = _zip_names(code_zip)
        for what, path in (("weights", spec.weights), ("dataset", spec.dataset if spec.dataset_is_file else None)):
            if path and path not in names:
                raise SpecError(f"{what} {path!r} is not in the job's code")
        if not output or not Path(output).is_absolute():
            raise SpecError("output must be an absolute path on the head's machine")
        job_id = new_id("j")
        code_path = self.settings.state_dir / "jobs" / job_id / "code.zip"
        write_private(code_path, code_zip)
        self.store.add_job(
            job_id, spec.name, spec.kind.value, spec_yaml, str(code_path), output, items,
            ranges, model_key(spec, code_zip), max(model_bytes, 0),
        )
        self.dispatcher.wake.set()
        return job_id

    def get(self, job_id: str) -> Job:
        return self.store.job(job_id)

    def list(self, limit: int) -> list[Job]:
        return self.store.jobs(limit=limit or 100)

    def cancel(self, job_id: str) -> Job:
        job = self.store.job(job_id)
        if job.state.finished:
            raise ConflictError(f"job {job_id} already {job.state.value}")
        self.dispatcher.cancel(job_id)
        return self.store.job(job_id)

    async def watch(self, job_id: str) -> AsyncIterator[Job]:
        self.store.job(job_id)  # NotFoundError before the stream starts
        with self.events.subscribe(job_id) as changed:
            while True:
                job = self.store.job(job_id)
                yield job
                if job.state.finished:
                    return
                try:
                    # The timeout is a safety net only: every change publishes an event.
                    await asyncio.wait_for(changed.wait(), timeout=5.0)
                except asyncio.TimeoutError:
                    pass
                changed.clear()


def model_key(spec: JobSpec, code_zip: bytes) -> str:
    """What calibration is keyed by: the model, its weights, its inputs and batch size. Jobs that share a key share
    their measurements, so a model's second job starts from the first one's figures."""
    if spec.kind is JobKind.KERNEL_EVAL:  # items are (problem, candidate) pairs: only the same ones time alike
        return hashlib.sha256(b"kernel-eval\0" + code_zip).hexdigest()[:16]
    digest = hashlib.sha256(f"{spec.model}\0{spec.dataset}\0{spec.batch_size}\0".encode())
    if spec.weights:
        with zipfile.ZipFile(io.BytesIO(code_zip)) as archive:
            digest.update(archive.read(spec.weights))
    return digest.hexdigest()[:16]


def _zip_names(code_zip: bytes) -> set[str]:
    try:
        with zipfile.ZipFile(io.BytesIO(code_zip)) as archive:
            return set(archive.namelist())
    except zipfile.BadZipFile:
        raise SpecError("the job's code is not a zip archive") from None
