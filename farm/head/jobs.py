"""Job intake and queries: what JobService does, apart from the wire."""

from __future__ import annotations

import asyncio
import builtins  # `list` in this module's class is a method
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from farm.core.errors import ConflictError, SpecError, UserError
from farm.core.ids import new_id
from farm.core.models import JobState
from farm.core.spec import MAX_SHARDS, parse_spec
from farm.data.results import Results
from farm.head import code_archive, datasets, output_folder, output_place, ray_compat
from farm.head.dispatch import Dispatcher
from farm.head.kinds.base import ShardedKind, Submission
from farm.head.events import JobEvents
from farm.head.settings import HeadSettings
from farm.head.store import Job, Store
from farm.local import write_private


@dataclass(frozen=True)
class Deleted:
    """A deleted job, as it was, and what became of its results."""

    job: Job
    outputs_removed: bool = False
    outputs_kept: str = ""  # why its results stayed, where they were asked for


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
        # Inflates the whole archive to check it (its declared sizes may lie): in a thread, off the event loop.
        members = await asyncio.to_thread(code_archive.names, code_zip, self.settings.max_unzipped_code_mb)
        submission = Submission(code_zip, members, items, dataset_location)
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
        folder = datasets.job_dir(self.settings.state_dir, job_id)
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

    async def retry_missing(self, job_id: str) -> Job:
        """A job that ended runs again for only its shards without a result (farm.head.store.retries), writing beside
        the results it has. A manifest it had (it succeeded with rows skipped) goes first: its presence says the
        results are complete, and they are written anew once the retry ends."""
        job = self.store.job(job_id)
        if not isinstance(self.dispatcher.handler(job), ShardedKind):
            raise ConflictError(f"job {job_id} is a {job.kind.value} job: it runs as a whole, not as shards, so it "
                                "has no missing rows to run again (submit it again)")
        if job.state.finished and self.dispatcher.holds(job_id):  # one still out could land after its shard reran
            raise ConflictError(f"job {job_id} has ended but its last shards are still being stopped: retry it in a "
                                "moment")
        self.store.retry_missing(job_id)
        if job.state is JobState.SUCCEEDED:
            await asyncio.to_thread(Results(job.output).remove_manifest)
        self.dispatcher.notify(job_id)
        self.dispatcher.wake.set()
        return self.store.job(job_id)

    async def delete(self, job_ids: builtins.list[str], outputs: bool = False) -> builtins.list[Deleted]:
        """Forget finished jobs: their records in one transaction (all or none: a job not finished is refused), then
        their files (`outputs`: their results too)."""
        job_ids = list(dict.fromkeys(job_ids))
        for job_id in job_ids:
            if self.dispatcher.holds(job_id):
                raise ConflictError(f"job {job_id} has ended but its last shards are still being stopped: delete it "
                                    "in a moment")
        return await self._remove_files(self.store.delete_jobs(job_ids), outputs)

    async def prune(self, older_than_s: float, states: builtins.list[str], outputs: bool = False
                    ) -> builtins.list[Deleted]:
        """Delete every job in `states` (finished ones; none: all three) that ended `older_than_s` ago or earlier."""
        finished = [s.value for s in JobState if s.finished]
        if any(s not in finished for s in states):
            raise UserError(f"prune takes finished states only ({', '.join(finished)}), not {states}")
        if not 0 <= older_than_s < 1e12:
            raise UserError("older_than_s must be 0 or more seconds")
        chosen = tuple(JobState(s) for s in states or finished)
        pruned = self.store.prune_jobs(time.time() - older_than_s, chosen, keep=self.dispatcher.holds)
        return await self._remove_files(pruned, outputs)

    async def _remove_files(self, jobs: builtins.list[Job], outputs: bool) -> builtins.list[Deleted]:
        """Each deleted job's folder in the state folder (its code package, its dataset's plan and read credential),
        its code package in Ray's GCS (Dispatcher.forget_code) and, with `outputs`, its results, unless a job still on
        record has the same output (it took the folder over with --overwrite). Files go after the records: a head
        stopped in between leaves files without a job, never a job without its files."""
        in_use = {output_key(o) for o in self.store.job_outputs()} if outputs else set()
        deleted = []
        for job in jobs:
            uri = await asyncio.to_thread(_code_uri, Path(job.code_path))
            if uri:
                self.dispatcher.forget_code(uri)
            await asyncio.to_thread(shutil.rmtree, datasets.job_dir(self.settings.state_dir, job.id), True)
            if not outputs or not job.output:
                deleted.append(Deleted(job))
            elif output_key(job.output) in in_use:
                deleted.append(Deleted(job, outputs_kept="another job on record writes the same output"))
            else:
                await asyncio.to_thread(output_folder.remove_results, job.output)
                deleted.append(Deleted(job, outputs_removed=True))
        return deleted

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
                except TimeoutError:
                    pass
                changed.clear()


def _code_uri(path: Path) -> str:
    """The Ray package URI of the code at `path` ("": gone)."""
    try:
        return ray_compat.code_uri(path.read_bytes())
    except FileNotFoundError:
        return ""


def output_key(output: str) -> str:
    """An output's identity: a bucket URI as it is, a folder resolved (links followed)."""
    return output if "://" in output else str(Path(output).resolve())
