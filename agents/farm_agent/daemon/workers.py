"""The agent's persistent workers: one process per (job, device), started on the job's first shard there and kept
until the job ends, is cancelled, or the node drains. Shards reach a worker as Assignments over a Unix socket pair
(farm_agent.work.frames) and queue there, so the next shard is waiting when one ends; the worker keeps the model
loaded between them (farm_agent.work.host).

A worker runs as the node's unprivileged account (farm.ray_user's farm-ray, where the agent is root), in a folder of
its own holding the job's code (fetched from the head for each worker, checked against its sha256), with a scrubbed
environment: never the agent's (its join token, the owner's other secrets), only PATH, PYTHONPATH, the locale, a
bucket's credentials (AWS_*), the job's own `env:` and the few variables Farm's worker needs. Each worker is a group
of processes (farm.node_group): ending it ends whatever its job code started.

A worker that dies takes its queued shards with it: each is reported ended with the reason, and the head runs them
again (its retry path); the job's next shard on that device starts a new worker.

A device that ran a shard in the last `keep_warm_s` (and a GPU from the agent's start) keeps one warm worker: started
before any job needs it (beside a running job only where the machine has cores the node does not lend, else once no
job's worker runs on the device), torch imported, and the device readied once no job's worker runs there
(farm_agent.work.host's warm mode). It becomes the worker of the next job on that device that has no `env:` of its
own (whose variables must be there from a process's start), with that job's code unpacked into its empty folder
first. So a job's first shard does not wait seconds for torch and a CUDA context (an H200: 4.4 s for torch's first
import, 1.1 s for the context, cuBLAS and cuDNN). A warm worker serves one job, as any worker; unused for
`keep_warm_s`, it ends."""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from farm.core.errors import AgentError
from farm.core.ids import NODE_ID_VAR
from farm.local import python_command
from farm.node_group import NodeGroup
from farm.switch_user import command_as
from farm.proto.v1 import agent_pb2
from farm_agent.work import frames
from farm_agent.work.host import FD_VAR, WARM_VAR

log = logging.getLogger("farm.agent")

# Variables of the agent's environment a worker keeps; everything else (the join token, the operator's own secrets)
# stays behind. A bucket's credentials (AWS_*: farm.data.locations.s3) are the node's to lend: its workers read
# datasets with them. OPENBLAS_* and MKL_* are the machine's own (OPENBLAS_CORETYPE is set where OpenBLAS's own
# detection computes wrong results or crashes on the processor): a worker without them is not the machine's Python.
KEPT_PREFIXES = ("AWS_", "OPENBLAS_", "MKL_")
KEPT = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
        "TMPDIR", "FARM_REQUIREMENTS_CACHE", "OMP_WAIT_POLICY")
# Variables a job's `env:` may not set in its workers (they are Farm's).
RESERVED = frozenset({"PATH", "HOME", "USER", "LOGNAME", FD_VAR, NODE_ID_VAR, "FARM_STATE_DIR", "PYTHONPATH",
                      "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONHOME", "PYTHONSTARTUP"})
CANCELLED_KEPT = 10_000
LIVE_TEXT = 8 * 1024  # characters of one live output piece passed on (the worker sends no more: capture.LIVE_PIECE)
STOP_S = 5.0  # how long a worker may take to leave once its socket closes, before its group is killed

Report = Callable[[agent_pb2.WorkReport], None]
FetchCode = Callable[[str], Awaitable[bytes]]


@dataclass
class Worker:
    job_id: str  # "" for a warm worker no job has taken yet
    device: str
    proc: asyncio.subprocess.Process
    writer: asyncio.StreamWriter
    group: NodeGroup
    folder: Path
    log_path: Path  # its stdout and stderr: the tail says why it died
    run: int = 0  # the job's run its latest assignment is of (a retried job's next run may reuse it)
    tickets: list[str] = field(default_factory=list)  # sent and not yet ended, in order
    reading: asyncio.Task[None] | None = None
    stopping: bool = False
    ending: asyncio.Task[None] | None = None  # its stop under way: run to its end even if who asked is cancelled
    expiry: asyncio.TimerHandle | None = None  # a warm worker's end, unless a job takes it first
    told_free: bool = False  # a warm worker told its device is free (no job's worker there): it warmed the device


class Workers:
    def __init__(self, node_id: str, state_dir: Path, account: pwd.struct_passwd | None, report: Report,
                 fetch_code: FetchCode, keep_warm_s: float = 0.0, warm_beside_jobs: bool = False) -> None:
        self.node_id = node_id
        self.keep_warm_s = keep_warm_s
        self.warm_beside_jobs = warm_beside_jobs  # the machine has cores the node does not lend (keep_warm)
        self.warm: dict[str, Worker] = {}  # per device: its warm worker, for the next job there
        self.warming: set[asyncio.Task[None]] = set()  # warm workers being started
        self.used: dict[str, float] = {}  # per device: when it last ended a shard (time.monotonic())
        self.closed = False
        self.state_dir = state_dir
        self.account = account
        self.report = report
        self.fetch_code = fetch_code
        self.workers: dict[tuple[str, str], Worker] = {}
        self.starting: dict[tuple[str, str], asyncio.Lock] = {}
        # The folder every worker's own folder goes in: random, 0700, the workers' account's (a fixed name in /tmp
        # is one another local user could plant first).
        self.root = Path(tempfile.mkdtemp(prefix="farm-work-"))
        # The workers' HOME (torch's and Triton's caches) and Farm's state in them (the kernel tuner's winners),
        # shared by the node's workers while the agent runs, as a Ray node's folder was.
        for folder in (self.root, self.root / "home", self.root / "home" / "state"):
            folder.mkdir(mode=0o700, exist_ok=True)
            if account is not None:
                os.chown(folder, account.pw_uid, account.pw_gid)
        self.logs = state_dir / "workers"  # the workers' output: the agent's, out of their reach
        self.logs.mkdir(mode=0o700, exist_ok=True)
        self.started = 0  # workers started so far: each one's folder and group are named by it
        self.ending: set[asyncio.Task[None]] = set()  # stops under way: the agent's own end waits for them
        # Jobs the head cancelled or ended (the last CANCELLED_KEPT), each with the run that ended: an order of that
        # run or an earlier one still on its way starts nothing; a later run's (a retry of its missing rows) does.
        self.cancelled: dict[str, int] = {}

    async def assign(self, assignment: agent_pb2.Assignment) -> None:
        """Queue an attempt on its (job, device) worker, starting one if there is none."""
        if not assignment.ticket:  # to a worker, the agent's own word that its device is free: no attempt
            log.warning("an order with no ticket, for job %s: ignored", assignment.job_id[:40])
            return
        key = (assignment.job_id, assignment.device)
        async with self.starting.setdefault(key, asyncio.Lock()):
            if assignment.run <= self.cancelled.get(assignment.job_id, -1):
                return
            worker = self.workers.get(key)
            if worker is None or worker.proc.returncode is not None:
                try:
                    code = await self._code(assignment)
                    worker = await self._take_warm(assignment, code) or await self._start(assignment, code)
                except Exception as exc:  # noqa: BLE001 - whatever it was (the head unreachable too), the head hears
                    message = exc.message if isinstance(exc, AgentError) else f"{type(exc).__name__}: {exc}"
                    self._ended(assignment.ticket, f"its worker could not start: {message[:500]}")
                    return
            worker.run = max(worker.run, assignment.run)
            worker.tickets.append(assignment.ticket)
            try:
                worker.writer.write(frames.pack(assignment))
                await worker.writer.drain()
            except (ConnectionError, OSError):
                pass  # the worker died: its reader reports its tickets ended
            self.report(agent_pb2.WorkReport(ack=agent_pb2.WorkAck(ticket=assignment.ticket)))

    async def cancel(self, job_id: str = "", ticket: str = "", run: int = 0) -> None:
        """Stop a job's workers of `run` or earlier (or the one holding `ticket`): what they run ends with them,
        unreported (the head voided those attempts when it cancelled them)."""
        if job_id:
            self.cancelled[job_id] = max(run, self.cancelled.pop(job_id, run))  # now the newest: kept the longest
            while len(self.cancelled) > CANCELLED_KEPT:
                del self.cancelled[next(iter(self.cancelled))]
            self.starting = {key: lock for key, lock in self.starting.items() if key[0] != job_id}
        for worker in list(self.workers.values()):
            if (worker.job_id == job_id and worker.run <= run) or (ticket and ticket in worker.tickets):
                worker.tickets.clear()
                await self._stop(worker)

    async def stop_all(self, reason: str) -> None:
        """Every worker stopped (the node drains, or its work stream closed): their attempts reported ended. Warm
        workers too: the owner taking the machine back gets their memory back."""
        self.used.clear()  # none started as they end
        for worker in [*self.workers.values(), *self.warm.values()]:
            await self._stop(worker, reason)

    async def close(self) -> None:
        """Every worker ended, those a job's end was stopping too (what they started with them), and their folder."""
        self.closed = True
        await asyncio.gather(*self.warming, return_exceptions=True)
        await self.stop_all("the agent stopped")
        await asyncio.gather(*self.ending, return_exceptions=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def keep_warm(self, device: str) -> None:
        """`device` keeps a warm worker for its next job for keep_warm_s from now: the one it has, or one started
        now where the machine has cores the node does not lend (`warm_beside_jobs`), else once no job's worker runs
        there (_stop starts it when the last one ends). Its torch import takes seconds of a core: beside a job on
        the 2-core dev box, which lends both, a Parquet job's second shard waited 1.21 s for its first batch; after
        the job on an H100 host lending 8 of 16 cores, the next job, submitted 0.3 s later, had its first shard's
        result 2.1 s after its placement, against 0.74 s for the same job after a pause."""
        if self.keep_warm_s <= 0 or self.closed:
            return
        self.used[device] = time.monotonic()
        warm = self.warm.get(device)
        if warm is not None:
            if warm.expiry is not None:
                warm.expiry.cancel()
            warm.expiry = asyncio.get_running_loop().call_later(self.keep_warm_s, self._expire, warm)
            return
        if any(task.get_name() == device for task in self.warming) or not self.warm_beside_jobs and any(
                w.device == device and not w.stopping for w in self.workers.values()):
            return
        task = asyncio.create_task(self._start_warm(device), name=device)
        self.warming.add(task)
        task.add_done_callback(self.warming.discard)

    async def _start_warm(self, device: str) -> None:
        try:
            warm = await self._spawn("", device, 0, None, {})
        except Exception as exc:  # noqa: BLE001 - no warm worker: the next job starts its own, as without one
            log.warning("a warm worker for %s could not start: %s", device, exc)
            return
        if self.closed:
            await self._stop(warm)
            return
        self.warm[device] = warm
        warm.expiry = asyncio.get_running_loop().call_later(self.keep_warm_s, self._expire, warm)
        log.info("a warm worker for %s started (pid %d): torch imported, the device readied once no job runs there",
                 device, warm.proc.pid)
        self._device_free(device)

    def _device_free(self, device: str) -> None:
        """Tell the device's warm worker, if no job's worker runs there, that it may warm the device (an Assignment
        with no ticket): a second CUDA context and cuDNN's warm-up beside a job slow that job's shards."""
        warm = self.warm.get(device)
        if warm is None or warm.told_free or any(w.device == device and not w.stopping
                                                 for w in self.workers.values()):
            return
        warm.told_free = True
        try:
            warm.writer.write(frames.pack(agent_pb2.Assignment(device=device)))
        except (ConnectionError, OSError):
            pass  # it died: its reader says so, and the next job starts its own

    def _expire(self, warm: Worker) -> None:
        if self.warm.get(warm.device) is warm:
            task = asyncio.ensure_future(self._stop(warm))
            self.warming.add(task)  # close() waits for it
            task.add_done_callback(self.warming.discard)

    async def _take_warm(self, assignment: agent_pb2.Assignment, code: bytes) -> Worker | None:
        """The device's warm worker as this job's, its `code` unpacked into the worker's folder; None where there is
        none, or the job has variables of its own (they must be there from a process's start)."""
        warm = self.warm.get(assignment.device)
        if warm is None or assignment.env:
            return None
        del self.warm[assignment.device]
        if warm.expiry is not None:
            warm.expiry.cancel()
        try:
            await asyncio.to_thread(unpack, code, warm.folder / "code", self.account)
        except (AgentError, OSError) as exc:  # its folder was not as left: the job starts a worker of its own
            log.warning("the warm worker for %s was not taken: %s", warm.device, exc)
            await self._stop(warm)
            return None
        except BaseException:
            await self._stop(warm)
            raise
        if warm.stopping or warm.proc.returncode is not None:  # it died meanwhile: the job starts its own
            return None
        warm.job_id, warm.run = assignment.job_id, assignment.run
        self.workers[(warm.job_id, warm.device)] = warm
        self._started(warm, warm=True)
        return warm

    async def _code(self, assignment: agent_pb2.Assignment) -> bytes:
        """The job's code package, fetched for each worker it starts (once a job and device: the daemon keeps none)."""
        data = await self.fetch_code(assignment.job_id)
        if hashlib.sha256(data).hexdigest() != assignment.code_sha256:
            raise AgentError("the job's code package does not match its sha256")
        return data

    async def _start(self, assignment: agent_pb2.Assignment, code: bytes) -> Worker:
        worker = await self._spawn(assignment.job_id, assignment.device, assignment.run, code, dict(assignment.env))
        self.workers[(worker.job_id, worker.device)] = worker
        self._started(worker, warm=False)
        return worker

    async def _spawn(self, job_id: str, device: str, run: int, code: bytes | None, job_env: dict[str, str]
                     ) -> Worker:
        """A worker process for `job_id` with its `code` unpacked; without code, a warm one for `device` (job_id
        empty), whose folder stays empty until a job takes it."""
        self.started += 1
        name = f"w{self.started}-{job_id[-12:] or 'warm'}"
        folder = self.root / name
        if code is not None:
            await asyncio.to_thread(unpack, code, folder / "code", self.account)
        else:
            (folder / "code").mkdir(parents=True)
            if self.account is not None:
                os.chown(folder / "code", self.account.pw_uid, self.account.pw_gid)
        uid = self.account.pw_uid if self.account else os.geteuid()
        group = NodeGroup.make(f"farm-work-{self.node_id}-{name}", uid)
        env = worker_env(self.root / "home", self.account, self.node_id, job_env)
        env.update(group.env())
        if code is None:
            env[WARM_VAR] = device
        ours, theirs = socket.socketpair()
        env[FD_VAR] = str(theirs.fileno())
        if self.account is not None:
            os.chown(folder, self.account.pw_uid, self.account.pw_gid)
        log_path = self.logs / f"{name}.log"
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            # As the node's account, switched in the worker's own process: the agent is never forked
            # (farm.switch_user: a fork of the threaded agent died at random before it became the worker).
            proc = await asyncio.create_subprocess_exec(
                *command_as(self.account, python_command("farm_agent.work.host")), stdin=subprocess.DEVNULL,
                stdout=log_fd, stderr=subprocess.STDOUT, cwd=folder / "code", env=env, pass_fds=(theirs.fileno(),),
                start_new_session=True)
        finally:
            os.close(log_fd)
            theirs.close()
        group.add(proc.pid)
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=frames.MAX_REPORT * 2)
        worker = Worker(job_id, device, proc, writer, group, folder, log_path, run)
        worker.reading = asyncio.create_task(self._read(worker, reader))
        return worker

    def _started(self, worker: Worker, warm: bool) -> None:
        log.info("worker for job %s on %s %s (pid %d)", worker.job_id, worker.device,
                 "taken warm" if warm else "started", worker.proc.pid)
        self.report(agent_pb2.WorkReport(worker=agent_pb2.WorkerStarted(job_id=worker.job_id, device=worker.device,
                                                                        pid=worker.proc.pid, warm=warm)))

    async def _read(self, worker: Worker, reader: asyncio.StreamReader) -> None:
        """A worker's reports until it closes its end: each attempt's output as it prints and its end, for its own
        tickets only (job code in the worker can write here too); then its death, if it was not asked to stop."""
        try:
            while (report := await frames.read(reader, agent_pb2.WorkReport, frames.MAX_REPORT)) is not None:
                which = report.WhichOneof("report")
                if which == "ended" and report.ended.ticket in worker.tickets:
                    worker.tickets.remove(report.ended.ticket)
                    self._ended(report.ended.ticket, report.ended.reason[:2000], worker.device,
                                report.ended.overhead_s)
                    self.keep_warm(worker.device)  # after a shard, not at its start: never racing its imports
                elif which == "output" and report.output.ticket in worker.tickets:
                    self.report(agent_pb2.WorkReport(output=agent_pb2.WorkOutput(
                        ticket=report.output.ticket, text=report.output.text[:LIVE_TEXT])))
        except AgentError as exc:
            log.warning("worker for job %s sent %s: stopping it", worker.job_id, exc.message)
        code = await worker.proc.wait() if not worker.stopping else worker.proc.returncode
        if not worker.stopping:
            reason = exit_reason(code, worker.log_path)
            if not worker.job_id:  # a warm worker: no job's shard to report it in; the next job starts its own
                log.warning("the warm worker for %s ended: %s", worker.device, reason)
            await self._stop(worker, reason)

    async def _stop(self, worker: Worker, reason: str = "") -> None:
        """End a worker, in a task of its own that the agent's close waits for: a stop asked by an order that is
        cancelled (the agent stopping meanwhile) still ends the worker's group, whatever its job code started."""
        worker.stopping = True
        if self.workers.get((worker.job_id, worker.device)) is worker:
            del self.workers[(worker.job_id, worker.device)]
            if time.monotonic() - self.used.get(worker.device, -self.keep_warm_s) < self.keep_warm_s:
                self.keep_warm(worker.device)  # its job is over there: the next one's worker, warm
            self._device_free(worker.device)
        if self.warm.get(worker.device) is worker:
            del self.warm[worker.device]
            if worker.expiry is not None:
                worker.expiry.cancel()
        if worker.ending is None:
            worker.ending = asyncio.ensure_future(self._end(worker, reason))
            self.ending.add(worker.ending)
            worker.ending.add_done_callback(self.ending.discard)
        await asyncio.shield(worker.ending)

    async def _end(self, worker: Worker, reason: str) -> None:
        worker.writer.close()  # the worker leaves once the shard it runs ends; it has STOP_S to
        try:
            await asyncio.wait_for(worker.proc.wait(), STOP_S if not reason else 0.5)
        except TimeoutError:
            pass
        await asyncio.to_thread(worker.group.end)
        if worker.proc.returncode is None:
            try:
                os.killpg(worker.proc.pid, 9)
            except ProcessLookupError:
                pass
            await worker.proc.wait()
        for ticket in worker.tickets:
            self._ended(ticket, reason or "its worker stopped")
        worker.tickets.clear()
        shutil.rmtree(worker.folder, ignore_errors=True)
        if worker.reading is not None and worker.reading is not asyncio.current_task():
            worker.reading.cancel()

    def _ended(self, ticket: str, reason: str, device: str = "", overhead_s: float = 0.0) -> None:
        self.report(agent_pb2.WorkReport(ended=agent_pb2.WorkEnded(ticket=ticket, reason=reason, device=device,
                                                                  overhead_s=overhead_s)))


def exit_reason(code: int | None, log_path: Path, tail_bytes: int = 8192) -> str:
    """Why a worker that was not asked to stop ended, for the shard's error: its exit status or signal by name, and
    the last lines it printed (a native crash's message is only there: the worker could not report it). Where
    faulthandler dumped a stack (farm_agent.work.host), the lines before it, its first line and the innermost frame."""
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with {code}"
    try:
        with open(log_path, "rb") as log_file:
            log_file.seek(max(0, os.fstat(log_file.fileno()).st_size - tail_bytes))
            tail = log_file.read().decode("utf-8", "replace")
    except OSError:
        tail = ""
    lines = [line.strip() for line in tail.splitlines()[1 if len(tail) >= tail_bytes else 0:] if line.strip()]
    fatal = max((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), default=None)
    if fatal is not None:
        frames_ = [line for line in lines[fatal:] if line.startswith("File ")]
        lines = lines[max(0, fatal - 2):fatal + 1] + frames_[:1]
    said = " | ".join(lines[-4:])[-800:]
    return f"its worker {how}" + (f"; its last output: {said}" if said else "")


def worker_env(home: Path, account: pwd.struct_passwd | None, node_id: str, job_env: dict[str, str]
               ) -> dict[str, str]:
    """A worker's whole environment: a few of the agent's, the job's own (not Farm's names), and Farm's."""
    env = {name: value for name, value in os.environ.items() if name in KEPT or name.startswith(KEPT_PREFIXES)}
    env.update({name: value for name, value in job_env.items() if name not in RESERVED})
    user = account.pw_name if account else pwd.getpwuid(os.geteuid()).pw_name
    env.update(HOME=str(home), USER=user, LOGNAME=user, FARM_STATE_DIR=str(home / "state"),
               MALLOC_ARENA_MAX=env.get("MALLOC_ARENA_MAX", "2"), PYTHONUNBUFFERED="1",
               # a native crash, from the first import on, prints the Python stack to the worker's log (exit_reason)
               PYTHONFAULTHANDLER="1",
               # OpenMP's threads (torch's on the CPU) sleep when they wait instead of spinning: on a lent machine a
               # spin burns the owner's cores and the shard's own decoders' (an image shard on the 2-core dev box:
               # 2.5 CPU s to 2.0, 6,000 images/s to 7,000, benchmarks/image_job.py). The machine's or the job's
               # own setting stands.
               OMP_WAIT_POLICY=env.get("OMP_WAIT_POLICY", "PASSIVE"))
    env[NODE_ID_VAR] = node_id
    env.setdefault("PATH", os.defpath)
    return env


MAX_CODE_BYTES = 1 << 30  # a job's code inflated, at most (the head capped the package it accepted already)


def unpack(code: bytes, folder: Path, account: pwd.struct_passwd | None) -> None:
    """A job's code package into `folder` (new, or a warm worker's empty one), owned by the workers' account. Member
    names are checked (no absolute paths, no `..`), and the bytes inflated are counted."""
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    with zipfile.ZipFile(io.BytesIO(code)) as archive:
        for member in archive.infolist():
            parts = Path(member.filename).parts
            if member.filename.startswith("/") or ".." in parts or not parts:
                raise AgentError(f"the job's code holds a path out of its folder: {member.filename[:80]!r}")
            target = folder.joinpath(*parts)
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(target, "xb") as out:
                while chunk := source.read(1 << 20):
                    total += len(chunk)
                    if total > MAX_CODE_BYTES:
                        raise AgentError(f"the job's code inflates past {MAX_CODE_BYTES:,} bytes")
                    out.write(chunk)
    if account is not None:
        for path in [folder, *folder.rglob("*")]:
            os.lchown(path, account.pw_uid, account.pw_gid)
