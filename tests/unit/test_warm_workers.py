"""Warm workers (farm_agent.daemon.workers): a device keeps one worker started before any job needs it (torch
imported; the device readied once no job's worker runs there); the next job on that device without an `env:` of its
own takes it, with its code unpacked into the worker's empty folder; a job with variables starts its own (they must be
there from a process's start); a warm worker unused for keep_warm_s ends, and the agent's close ends it. Real workers
(farm_agent.work.host processes), no head."""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import psutil

from farm.proto.v1 import agent_pb2
from farm_agent.daemon.workers import Worker, Workers
from farm_agent.work.host import DEVICE_WARMED


def code_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("job.py", "X = 1\n")
    return buffer.getvalue()


CODE = code_zip()


async def fetch(job_id: str) -> bytes:
    return CODE


def order(job_id: str, ticket: str, env: dict[str, str] | None = None) -> agent_pb2.Assignment:
    return agent_pb2.Assignment(ticket=ticket, job_id=job_id, shard=0, entry="run_shard", device="cpu",
                                task_json=b"{}", code_sha256=hashlib.sha256(CODE).hexdigest(), run=1, env=env or {})


async def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait up to 30 s for `check` to hold (a real worker process imports torch first)."""
    for _ in range(600):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


def warmed(worker: Worker) -> bool:
    """Whether the warm worker readied its device (its log says so)."""
    return worker.log_path.exists() and DEVICE_WARMED in worker.log_path.read_text()


async def warm_one(workers: Workers) -> Worker:
    workers.keep_warm("cpu")
    await eventually(lambda: "cpu" in workers.warm, "a warm worker started")
    return workers.warm["cpu"]


def test_the_next_job_without_variables_takes_the_warm_worker_with_its_code(tmp_path: Path) -> None:
    reports: list[agent_pb2.WorkReport] = []

    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, reports.append, fetch, keep_warm_s=60)
        try:
            warm = await warm_one(workers)
            assert list((warm.folder / "code").iterdir()) == []  # nothing of any job's before one takes it
            await workers.assign(order("j-with-env", "t-env", {"SEED": "1"}))
            own = workers.workers[("j-with-env", "cpu")]
            assert own is not warm and workers.warm.get("cpu") is warm  # variables: a worker of its own

            await workers.assign(order("j-plain", "t-plain"))
            taken = workers.workers[("j-plain", "cpu")]
            assert taken is warm and taken.job_id == "j-plain" and "cpu" not in workers.warm
            assert (taken.folder / "code" / "job.py").read_text() == "X = 1\n"
            assert taken.proc.returncode is None
            await workers.cancel("j-plain", run=1)  # the job's end ends it, as any worker's
            assert taken.proc.returncode is not None
        finally:
            await workers.close()

    asyncio.run(scenario())
    started = [r.worker for r in reports if r.HasField("worker")]
    assert [(s.job_id, s.warm) for s in started] == [("j-with-env", False), ("j-plain", True)]


def test_the_next_warm_worker_starts_once_the_jobs_worker_ends_never_beside_it(tmp_path: Path) -> None:
    # A warm worker started beside a running job took its CPUs (torch's import) and its GPU (a second context): the
    # device's next one starts when the job's worker ends; a node that drains starts none.
    reports: list[agent_pb2.WorkReport] = []

    async def ended(ticket: str) -> None:
        await eventually(lambda: any(r.HasField("ended") and r.ended.ticket == ticket for r in reports),
                         f"{ticket} ended")

    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, reports.append, fetch, keep_warm_s=60)
        try:
            await workers.assign(order("j-1", "t-1"))  # no warm worker yet: the job starts its own
            job = workers.workers[("j-1", "cpu")]
            await ended("t-1")  # its shard ended (its task does not decode): the device ran a shard
            await asyncio.sleep(0.5)
            assert "cpu" not in workers.warm and not workers.warming and job.proc.returncode is None
            await workers.cancel("j-1", run=1)  # the job's end
            warm = await warm_one(workers)
            assert warm is not job and warm.job_id == ""

            await workers.assign(order("j-2", "t-2"))  # takes it; its shard ends, then the node drains
            await ended("t-2")
            await workers.stop_all("its node drained")
            await asyncio.sleep(0.5)
            assert not workers.warm and not workers.warming
        finally:
            await workers.close()

    asyncio.run(scenario())


def test_where_the_machine_has_cores_the_node_does_not_lend_the_next_warm_worker_starts_beside_the_job(
        tmp_path: Path) -> None:
    # After its job, a warm worker took ~1.5 s to start: a job submitted right after the last one waited for it (an
    # H100 host lending 8 of its 16 cores). With spare cores its torch import runs beside the job, after a shard.
    reports: list[agent_pb2.WorkReport] = []

    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, reports.append, fetch, keep_warm_s=60, warm_beside_jobs=True)
        try:
            await workers.assign(order("j-1", "t-1"))
            job = workers.workers[("j-1", "cpu")]
            assert not workers.warming and "cpu" not in workers.warm  # not at its start: never racing its imports
            # Its shard ends (its task does not decode): the device ran a shard.
            await eventually(lambda: "cpu" in workers.warm, "a warm worker started")
            warm = workers.warm["cpu"]  # started then, while the job's worker runs
            assert warm is not job and warm.job_id == "" and job.proc.returncode is None and not job.stopping
            # Its imports run beside the job; its device waits for the job's end (a second CUDA context and cuDNN's
            # warm-up beside an image job on an H100 slowed a shard 2.3x).
            await asyncio.sleep(3.0)  # time enough to warm the device, had it been told to
            assert not warmed(warm) and not warm.told_free
            await workers.cancel("j-1", run=1)
            await eventually(lambda: warmed(warm), "the warm worker readied its device")
            assert warm.told_free and warm.proc.returncode is None
        finally:
            await workers.close()

    asyncio.run(scenario())


def test_a_warm_worker_started_on_a_free_device_warms_it_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, lambda report: None, fetch, keep_warm_s=60)
        try:
            warm = await warm_one(workers)
            await eventually(lambda: warmed(warm), "the warm worker readied its device")
        finally:
            await workers.close()

    asyncio.run(scenario())


def test_a_warm_worker_unused_for_keep_warm_s_ends_and_close_ends_the_next(tmp_path: Path) -> None:
    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, lambda report: None, fetch, keep_warm_s=1.5)
        try:
            first = await warm_one(workers)
            process = psutil.Process(first.proc.pid)
            for _ in range(200):
                if first.ending is not None and first.ending.done():
                    break
                await asyncio.sleep(0.05)
            assert first.proc.returncode is not None and "cpu" not in workers.warm
            assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
            assert not first.folder.exists()
            second = await warm_one(workers)
        finally:
            await workers.close()
        assert second.proc.returncode is not None and not workers.root.exists()

    asyncio.run(scenario())


def test_no_warm_worker_where_keep_warm_s_is_0(tmp_path: Path) -> None:
    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, lambda report: None, fetch, keep_warm_s=0)
        try:
            workers.keep_warm("cpu")
            await asyncio.sleep(0.5)
            assert not workers.warm and not workers.warming
        finally:
            await workers.close()

    asyncio.run(scenario())


def test_a_warm_worker_whose_folder_was_written_to_is_not_taken(tmp_path: Path) -> None:
    """Every worker of a node runs as its one account: another job's worker could write into a warm worker's empty
    folder. A job's code never lands over what is there: that warm worker ends and the job starts its own."""
    reports: list[agent_pb2.WorkReport] = []

    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, reports.append, fetch, keep_warm_s=60)
        try:
            warm = await warm_one(workers)
            (warm.folder / "code" / "job.py").write_text("X = 'planted'\n")
            await workers.assign(order("j-plain", "t-plain"))
            own = workers.workers[("j-plain", "cpu")]
            assert own is not warm and (own.folder / "code" / "job.py").read_text() == "X = 1\n"
            assert warm.ending is not None
            await warm.ending
            assert warm.proc.returncode is not None
        finally:
            await workers.close()

    asyncio.run(scenario())
    assert [(r.worker.job_id, r.worker.warm) for r in reports if r.HasField("worker")] == [("j-plain", False)]


def test_a_warm_worker_has_the_image_decoders_server_started(tmp_path: Path) -> None:
    """A job's first batch of small images forks its decoder processes from a server the worker started while it
    warmed: started with that batch, the server's start and imports took it 0.47 s instead of 0.06 s."""
    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, lambda report: None, fetch, keep_warm_s=60)
        try:
            warm = await warm_one(workers)
            worker = psutil.Process(warm.proc.pid)

            def children() -> list[str]:
                try:
                    return [" ".join(child.cmdline()) for child in worker.children()]
                except psutil.Error:  # one ended meanwhile (the warm-up's own): asked again
                    return []

            for _ in range(1200):  # its warm-up (torch's import) takes seconds
                if any("forkserver" in line for line in children()):
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"no decoders' server among {children()}")
        finally:
            await workers.close()

    asyncio.run(scenario())
