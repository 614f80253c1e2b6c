"""An agent remembers the jobs the head cancelled, by run (farm_agent.daemon.workers): an order of a cancelled run
still on its way starts nothing, but the job's next run (`farm job ID --retry-missing`) starts its worker. Real
workers (farm_agent.work.host processes), no head."""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from pathlib import Path

from farm.proto.v1 import agent_pb2
from farm_agent.daemon.workers import Workers


def code_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("job.py", "X = 1\n")
    return buffer.getvalue()


def test_a_node_that_saw_run_1_cancelled_runs_run_2(tmp_path: Path) -> None:
    code = code_zip()
    reports: list[agent_pb2.WorkReport] = []

    async def fetch(job_id: str) -> bytes:
        return code

    def order(ticket: str, run: int) -> agent_pb2.Assignment:
        return agent_pb2.Assignment(ticket=ticket, job_id="j-1", shard=0, entry="run_shard", device="cpu",
                                    task_json=b"{}", code_sha256=hashlib.sha256(code).hexdigest(), run=run)

    async def scenario() -> None:
        workers = Workers("n-1", tmp_path, None, reports.append, fetch)
        try:
            await workers.cancel("j-1", run=1)
            await workers.assign(order("late-of-run-1", 1))  # sent before the cancel, read after it
            assert reports == [] and not workers.workers
            await workers.assign(order("of-run-2", 2))
            assert ("j-1", "cpu") in workers.workers and workers.workers[("j-1", "cpu")].run == 2
            await workers.cancel("j-1", run=1)  # a cancel of the earlier run leaves the later run's worker be
            assert ("j-1", "cpu") in workers.workers
            await workers.cancel("j-1", run=2)
            assert not workers.workers
        finally:
            await workers.close()

    asyncio.run(scenario())
    said = [r.WhichOneof("report") for r in reports]
    assert said[:2] == ["worker", "ack"] and reports[1].ack.ticket == "of-run-2"
    assert all(r.ended.ticket != "late-of-run-1" for r in reports if r.HasField("ended"))
