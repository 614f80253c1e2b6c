"""A persistent worker: one process per (job, device) on a node, started by the agent (farm_agent.daemon.workers) as the
node's unprivileged account, in the job's code folder, with a scrubbed environment. It keeps the job's model loaded
and warm between shards (farm_agent.work.jobcode caches it per process) and takes its shards from a queue the agent
fills, so that a device never waits for its next shard's model load.

`python -P -m farm_agent.work.host` with FARM_WORK_FD naming its end of a socket pair to the agent: Assignments come
in, WorkReports go out (farm_agent.work.frames). Each shard sends its own result to the head by its upload ticket
(farm_agent.work.upload) and then says it ended; what it prints goes out while it runs (WorkOutput); the worker
exits when the agent closes its end.

A warm worker (WARM_VAR naming its device) is one the agent starts before any job needs it: it imports torch and
Farm's shard code and starts the image decoders' server (farm.data.decoders) at once, and readies the device (the
backend's warm: on a GPU its context, cuBLAS and cuDNN) once the agent says no job runs there (an Assignment with no
ticket): seconds a job's first shard would otherwise wait, never taken from a running job's shards (on an H100, a
second context and cuDNN's warm-up beside an image job slowed a shard of 10,240 rows from 0.56 s to 1.29 s). It then
waits for its first Assignment. The agent gives it to the next job without an `env:` of its own on that device: the
job's code lands in its (until then empty) folder first. It runs that job alone, as any worker; nothing of a job ever
ran in it before."""

from __future__ import annotations

import importlib
import os
import queue
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from farm.core.errors import FarmError
from farm.core.tasks import ResultRoute, ShardFigures
from farm.core.wire import decode_task
from farm.proto.v1 import agent_pb2
from farm_agent.work import frames
from farm_agent.work.capture import LIVE
from farm_agent.work.upload import Finishing

FD_VAR = "FARM_WORK_FD"
WARM_VAR = "FARM_WORK_WARM"
LIVE_EVERY_S = 0.5
DEVICE_WARMED = "warm worker: warmed"  # its log line, once its device is ready


def main() -> None:
    sock = socket.socket(fileno=int(os.environ.pop(FD_VAR)))
    sys.path.insert(0, str(Path.cwd()))  # the job's code, as Ray's working_dir had it
    # Each assignment with its task where the receiving thread decoded it (to read it ahead), else None.
    waiting: queue.Queue[tuple[agent_pb2.Assignment, Any] | None] = queue.Queue()
    sending = threading.Lock()

    def report(message: agent_pb2.WorkReport) -> None:
        with sending:
            sock.sendall(frames.pack(message))

    def receive() -> None:
        """Assignments into the queue as they come: the agent sends the next shard while this one runs, and its data
        is read ahead meanwhile."""
        try:
            while (assignment := frames.recv(sock, agent_pb2.Assignment, frames.MAX_ASSIGNMENT)) is not None:
                ahead = assignment.ticket and busy.is_set()  # no ticket: the agent's word that the device is free
                waiting.put((assignment, read_ahead(assignment) if ahead else None))
        except (FarmError, OSError):
            pass
        waiting.put(None)

    def ended(assignment: agent_pb2.Assignment, reason: str, figures: ShardFigures | None, busy_s: float | None
              ) -> None:
        """The attempt ended; `busy_s`: the device's time on it from when it could start (None: a first attempt,
        whose model load is no per-shard cost), of which what is not compute is its overhead."""
        overhead = 0.0 if busy_s is None or figures is None else max(busy_s - figures.seconds, 0.0)
        report(agent_pb2.WorkReport(ended=agent_pb2.WorkEnded(ticket=assignment.ticket, reason=reason,
                                                              overhead_s=overhead)))

    def finished(assignment: agent_pb2.Assignment, finishing: Finishing, busy_s: float | None) -> None:
        ended(assignment, *finishing.wait(), busy_s)

    running: list[str] = [""]  # the ticket of the attempt running now
    busy = threading.Event()  # an attempt runs now

    def output(text: str) -> None:
        report(agent_pb2.WorkReport(output=agent_pb2.WorkOutput(ticket=running[0], text=text)))

    def send_output() -> None:
        """What the running attempt prints, every LIVE_EVERY_S, while it runs (`farm logs --follow`)."""
        while True:
            time.sleep(LIVE_EVERY_S)
            try:
                LIVE.send(output)
            except OSError:  # the agent closed its end: the worker is ending
                return

    threading.Thread(target=receive, name="farm-work-orders", daemon=True).start()
    threading.Thread(target=send_output, name="farm-live-output", daemon=True).start()
    first: tuple[agent_pb2.Assignment, Any] | None = None
    if warm_device := os.environ.pop(WARM_VAR, ""):
        warm_code()
        while (first := waiting.get()) is not None and not first[0].ticket:
            warm_backend(warm_device)  # no job runs there now; a job's first shard, if it came meanwhile, waits
        if first is None:
            return
        importlib.invalidate_caches()  # the job's code arrived in this folder after the warm-up's imports
    free: float | None = None  # when the device was last free: the next attempt could start from then (it queued)
    while (order := first if first is not None else waiting.get()) is not None:
        first = None
        assignment, task = order
        if not assignment.ticket:  # the device-free word, late: this worker's job runs there now
            continue
        ready = free
        running[0] = assignment.ticket  # no shard runs now: the live stream (capture.LIVE) holds nothing to send
        busy.set()
        reason, result = run(assignment, task)
        busy.clear()
        free = time.monotonic()
        busy_s = None if ready is None else free - ready
        if isinstance(result, Finishing):  # its result is sent while the next attempt runs
            threading.Thread(target=finished, args=(assignment, result, busy_s), name="farm-ended").start()
        else:
            ended(assignment, reason, result, busy_s)


def read_ahead(assignment: agent_pb2.Assignment) -> Any:
    """The next attempt's first batches read while this one runs, where its kind reads a dataset; its task, decoded
    (None where it could not be: the attempt decodes it again and says why, as it does a failed read)."""
    from farm_agent.work import kinds

    try:
        task = decode_task(assignment.entry, assignment.task_json)
        if (start := kinds.read_ahead(assignment.entry)) is not None:
            start(task, assignment.ticket)
    except Exception:  # noqa: BLE001 - met again by the attempt, which reports it
        return None
    return task


def warm_code() -> None:
    """Farm's shard code imported (torch with it) and the image decoders' server started: the CPU's part of warming,
    which touches no device; a failure only leaves it for the first shard."""
    try:
        from farm.data import decoders
        from farm_agent.work.kinds import inference  # noqa: F401 - the shard code and what it imports (pyarrow)

        decoders.start_server()
    except Exception as exc:  # noqa: BLE001 - the job's first shard meets it again and reports it
        print(f"warming Farm's shard code failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def warm_backend(device: str) -> None:
    """`device`'s backend warmed (a GPU's context, cuBLAS and cuDNN); a failure only leaves it for the first
    shard."""
    started = time.monotonic()
    try:
        from farm_agent import backends

        backends.load(device.split(":")[0]).warm(device)
    except Exception as exc:  # noqa: BLE001 - the job's first shard meets it again and reports it
        print(f"warming {device} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    print(f"{DEVICE_WARMED} {device} in {time.monotonic() - started:.2f} s", file=sys.stderr, flush=True)


def run(assignment: agent_pb2.Assignment, task: Any = None) -> tuple[str, ShardFigures | Finishing | None]:
    """Run one attempt (`task`: its task, if already decoded): empty and its figures where its result (or its
    failure: None) went to the head; else why it could not."""
    from farm_agent.work.kinds import attempt

    try:
        task = task if task is not None else decode_task(assignment.entry, assignment.task_json)
        route = ResultRoute(assignment.result_address, assignment.ca_pem, assignment.ticket)
        return "", attempt(assignment.entry)(task, route)
    except FarmError as exc:
        return exc.message, None
    except Exception as exc:  # noqa: BLE001 - the worker lives on: the head hears why this attempt ended
        return f"{type(exc).__name__}: {exc}"[:2000], None


if __name__ == "__main__":
    main()
