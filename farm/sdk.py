"""Farm from Python: `farm.Client` and its `Job` handles, typed records in and out (no protobuf), paths as str or
Path. The CLI and this module share one wire client (farm.client.api) and one preflight (farm.client.preflight).

    import farm

    with farm.Client(profile="lab") as client:            # or farm.Client(): FARM_HEAD, the default profile, ...
        job = client.submit("examples/digits/infer.yaml")  # a spec file, YAML text, or a dict of spec fields
        info = job.wait()                                  # JobInfo: state, items, metrics, shards, ...
        for line in job.logs(): print(line.message)
        table = job.results().to_table()                   # Arrow, from anywhere the API token reaches the head
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from farm.client import api
from farm.core.errors import SpecError
from farm.proto import convert

if TYPE_CHECKING:
    from farm.client.kernels import Candidates, Problems
    from farm.client.results import ResultBatches
    from farm.core.kernels import KernelResult

FINISHED = ("succeeded", "failed", "cancelled")


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ShardInfo(_Record):
    index: int
    state: str  # pending | running | succeeded | failed | cancelled
    node_name: str = ""
    backend: str = ""
    device: str = ""
    start: int = 0  # the item range [start, stop)
    stop: int = 0
    items: int = 0
    seconds: float = 0.0
    energy_j: float = 0.0
    energy_source: str = ""  # counter | vendor-estimate | model-estimate
    attempts: int = 0
    error: str = ""


class JobInfo(_Record):
    id: str
    name: str
    kind: str
    state: str  # queued | running | succeeded | failed | cancelled
    items: int = 0
    items_done: int = 0
    output: str = ""
    error: str = ""
    created_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    metrics: dict[str, float] = Field(default_factory=dict)  # items_per_s, items_per_j, accuracy, wall_s, ...
    energy_j: float = 0.0
    energy_sources: list[str] = Field(default_factory=list)
    shards: list[ShardInfo] = Field(default_factory=list)
    run: int = 1  # 1, then one more each time its missing rows ran again (Job.retry_missing)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


class LogLine(_Record):
    id: int
    ts: float  # unix seconds
    level: str  # info | warning | error | output (what a shard printed)
    message: str
    shard: int | None = None  # the shard the line is about; None: the job's own line


class NodeInfo(_Record):
    id: str
    name: str
    state: str  # joining | ready | draining | offline
    backends: list[str] = Field(default_factory=list)  # the available ones
    busy: str = ""  # why its owner needs it now, if they do


def _job_info(message: Any) -> JobInfo:
    data = convert.to_dict(message)
    data["items_done"] = sum(s.items for s in message.shards if s.state == "succeeded")
    return JobInfo.model_validate(data)


def _log_line(message: Any) -> LogLine:
    return LogLine(id=message.id, ts=message.ts, level=message.level, message=message.message,
                   shard=message.shard if message.HasField("shard") else None)


class Client:
    """A connection to one head. Which head: `head` (HOST:PORT, with `token` and `ca`), else `profile` (farm profile
    list), else FARM_HEAD, FARM_PROFILE or the config file's default profile, else the head of the local state
    folder (`state_dir`, default FARM_STATE_DIR or ~/.farm)."""

    def __init__(self, profile: str | None = None, *, head: str | None = None, token: str | None = None,
                 ca: str | Path | None = None, state_dir: str | Path | None = None, timeout: float = 30.0) -> None:
        found = api.find_head(head, token, state_dir=Path(state_dir) if state_dir else None,
                              ca=Path(ca) if ca else None, profile=profile)
        self.api = api.Client(found, timeout=timeout)  # the wire client underneath, as the CLI uses it

    @property
    def address(self) -> str:
        return self.api.head.address

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.api.close()

    def submit(self, spec: str | Path | Mapping[str, Any], *, workdir: str | Path = ".", check: bool = True,
               overwrite: bool = False) -> Job:
        """Submit a job: `spec` is a spec file (Path, or a str ending in .yaml/.yml), YAML text, or a dict of spec
        fields. `workdir` is shipped as the job's code (relative outputs are under it); `check` runs the model on a
        small batch here first; `overwrite` lets the job replace another job's results in its output folder."""
        from farm.client.preflight import prepare

        workdir = Path(workdir)
        if isinstance(spec, Path) or (isinstance(spec, str) and "\n" not in spec
                                      and spec.strip().endswith((".yaml", ".yml"))):
            prepared = prepare(Path(spec), workdir, check=check)
        else:
            text = yaml.safe_dump(dict(spec), sort_keys=False) if isinstance(spec, Mapping) else spec
            if not isinstance(text, str):
                raise SpecError(f"a spec is a file, YAML text or a dict, not {type(spec).__name__}")
            with tempfile.TemporaryDirectory(prefix="farm-spec-") as folder:
                path = Path(folder) / "spec.yaml"
                path.write_text(text)
                prepared = prepare(path, workdir, check=check)
        return Job(self, self.api.submit_prepared(prepared, overwrite=overwrite))

    def job(self, job_id: str) -> Job:
        """A handle on a job by its id (re-attach to one submitted earlier, from anywhere)."""
        self.api.job(job_id)  # NotFoundError now rather than later
        return Job(self, job_id)

    def jobs(self, limit: int = 100) -> list[JobInfo]:
        return [_job_info(j) for j in self.api.list_jobs(limit)]

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(id=n.id, name=n.name, state=n.state, busy=n.busy,
                         backends=[b.name for b in n.backends if b.available]) for n in self.api.nodes()]

    def results(self, job_id: str) -> ResultBatches:
        """A job's results so far (the data plane's reader): iterate Arrow record batches, or `.to_table()`,
        `.to_pandas()`."""
        return self.api.results(job_id)

    def evaluate_kernels(self, problems: Problems, candidates: Candidates, **options: Any) -> list[KernelResult]:
        """Candidate kernels judged on the fleet as one kernel-eval job (farm.client.api.Client.evaluate_kernels)."""
        return self.api.evaluate_kernels(problems, candidates, **options)


class Job:
    """A submitted job, by id: it keeps running whatever happens to this handle or the program holding it."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def info(self) -> JobInfo:
        """The job's record now."""
        return _job_info(self.client.api.job(self.id))

    def wait(self, timeout: float | None = None, on_change: Callable[[JobInfo], None] | None = None) -> JobInfo:
        """Block until the job ends (succeeded, failed or cancelled) and return its record; `on_change` sees every
        change on the way. TimeoutError after `timeout` seconds (checked at each change, and every few seconds), the
        job still running; a head that restarts meanwhile is waited for."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # a head that restarts meanwhile is waited for (api.through_restarts)
            for message in api.through_restarts(lambda: self.client.api.watch(self.id)):
                info = _job_info(message)
                if on_change is not None:
                    on_change(info)
                if info.finished:
                    return info
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} is still {info.state} after {timeout} s")

    def logs(self, shard: int | None = None) -> list[LogLine]:
        """The job's log so far: its events, what its shards printed and their tracebacks (`shard`: one shard's)."""
        return [_log_line(line) for line in self.client.api.logs(self.id, shard)]

    def follow_logs(self, shard: int | None = None) -> Iterator[LogLine]:
        """The job's log lines so far, then each new one as it is written, until the job ends (across a head's
        restart)."""
        seen = 0
        # Late binding on purpose: a reconnect resumes after the last line seen.
        for line in api.through_restarts(lambda: self.client.api.follow_logs(self.id, shard, after=seen)):  # noqa: B023
            seen = line.id
            yield _log_line(line)

    def results(self) -> ResultBatches:
        """The job's results (see Client.results)."""
        return self.client.results(self.id)

    def cancel(self) -> JobInfo:
        return _job_info(self.client.api.cancel(self.id))

    def retry_missing(self) -> JobInfo:
        """Run the job, which ended (failed, cancelled, or succeeded with rows skipped), again for only its shards
        without a result, into the same output; its record now (running: `wait()` for its end). ConflictError: it
        has not ended, or misses nothing."""
        return _job_info(self.client.api.retry_missing(self.id))
