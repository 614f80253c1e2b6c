"""Job intake and queries: what JobService does, apart from the wire."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from farm.core.errors import ConflictError, SpecError
from farm.core.ids import new_id
from farm.core.spec import MAX_SHARDS, parse_spec
from farm.head import code_archive, output_folder, output_place
from farm.head.dispatch import Dispatcher
from farm.head.kinds.base import Submission
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

    async def submit(self, spec_yaml: str, code_zip: bytes, items: int, output: str, model_bytes: int = 0,
                     overwrite: bool = False, dataset_location: str = "") -> str:
        """Validate, let the job's kind plan it, then persist the job, its code and its shards before anyone is told
        it exists (`overwrite`: its output folder may hold another job's results, removed first). The kind plans in
        a worker thread: a located dataset's planning reads footers and listings, maybe over the network, and the
        event loop carries every heartbeat."""
        spec = parse_spec(spec_yaml, "spec")
        if len(code_zip) > self.settings.max_code_mb * 1024 * 1024:
            raise SpecError(f"the job's code is over {self.settings.max_code_mb} MB zipped")
        submission = Submission(code_zip, code_archive.names(code_zip, self.settings.max_unzipped_code_mb), items,
                                dataset_location)
        handler = self.dispatcher.handlers[spec.kind]
        plan = await asyncio.to_thread(handler.plan, spec, submission)
        if plan.items < 1 or not (plan.ranges or handler.sizes_shards(spec)):
            raise SpecError("the dataset is empty")
        if len(plan.ranges) > MAX_SHARDS:  # every count a spec multiplies ends here: a row and a file per shard
            raise SpecError(f"the job makes {len(plan.ranges):,} shards: at most {MAX_SHARDS:,}")
        if not output.startswith("s3://"):  # a bucket is written with the head's own credentials (farm.data.results)
            if not output or not Path(output).is_absolute():
                raise SpecError("output must be an absolute path on the head's machine, or s3://bucket/prefix")
            output_place.check(output, self.settings, self.store)
            output_folder.claim(Path(output), overwrite)
        job_id = new_id("j")
        folder = self.settings.state_dir / "jobs" / job_id
        code_path = folder / "code.zip"
        write_private(code_path, code_zip)
        for name, data in plan.keep.items():
            write_private(folder / name, data)
        self.store.add_job(
            job_id, spec.name, spec.kind.value, spec_yaml, str(code_path), output, plan.items,
            plan.ranges, plan.model_key, max(model_bytes, 0),
        )
        for note in plan.notes:
            self.store.log(job_id, "info", note)
        self.dispatcher.admit(job_id, spec)
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
