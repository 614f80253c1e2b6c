"""A synchronous client of the head's JobService and FleetService."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc

from farm.client.preflight import PreparedJob
from farm.core.kernels import KernelResult
from farm.core.errors import ERRORS_BY_STATUS, FarmError, HeadUnavailableError, NotFoundError, UserError
from farm.local import default_state_dir, read_json, recorded_alive
from farm.proto.v1 import fleet_pb2, fleet_pb2_grpc, job_pb2, job_pb2_grpc

if TYPE_CHECKING:
    from farm.client.kernels import Candidates, Problems
    from farm.client.results import ResultBatches

MAX_MESSAGE = 256 * 1024 * 1024
INLINE_CODE = 1024 * 1024  # a job's code up to this goes in its Submit; more in chunks of this (UploadCode)
PREFIX_SEARCH = 500  # a job named by the start of its id is looked for among this many of the latest
FULL_JOB_ID = re.compile(r"j-[0-9a-f]{8}")  # farm.core.ids.new_id("j")
LOCAL_PROFILE = "local"  # the head running from the local state directory
T = TypeVar("T")


@dataclass(frozen=True)
class HeadInfo:
    address: str
    api_token: str = field(repr=False)
    join_token: str = field(default="", repr=False)
    pid: int = 0  # the local head's process; 0 for a head elsewhere
    tls: bool = True  # False: a head started with --insecure
    ca_pem: bytes | None = field(default=None, repr=False)  # the head's CA; None with TLS: the system's roots
    ca_hash: str = ""
    profile: str = ""  # the profile it was found through


def find_head(head: str | None = None, token: str | None = None, state_dir: Path | None = None,
              ca: Path | None = None, profile: str | None = None) -> HeadInfo:
    """The head to talk to, first match: `head` (HOST:PORT), `profile`, FARM_HEAD, FARM_PROFILE or the config
    file's default profile (farm.client.config), else the head running from the local state directory (`state_dir`
    given, or the profile `local`: that head, whatever the environment says). A token (`token`, FARM_TOKEN,
    FARM_TOKEN_FILE) and a CA file (`ca`, FARM_CA) override the profile's."""
    from farm.client.config import FarmConfig, config_path, read_secret_file

    config = FarmConfig.load()
    token = token or config.token or (read_secret_file(config.token_file, "FARM_TOKEN_FILE")
                                      if config.token_file else None)
    ca = ca or config.ca
    local = state_dir is not None or profile == LOCAL_PROFILE
    address = head or (None if profile or local else config.head)
    if address:
        if not token:
            raise UserError(f"the head at {address} needs an API token: pass --token, or set FARM_TOKEN or "
                            "FARM_TOKEN_FILE, or use a profile (farm profile add)")
        if config.insecure:
            return HeadInfo(address=address, api_token=token, tls=False)
        return HeadInfo(address=address, api_token=token, ca_pem=_read_ca(ca) if ca else None)
    name = profile or (None if local else config.profile)
    if name and name != LOCAL_PROFILE:
        chosen = config.named(name)
        if not token and chosen.token_file is None:
            raise UserError(f"profile {name!r} in {config_path()} names no token_file: pass --token-file or set "
                            "FARM_TOKEN")
        token = token or read_secret_file(chosen.token_file, f"profile {name!r}'s token_file")  # type: ignore[arg-type]
        ca = ca or chosen.ca_file
        return HeadInfo(address=chosen.address, api_token=token, tls=not (chosen.insecure or config.insecure),
                        ca_pem=_read_ca(ca) if ca and not chosen.insecure else None, profile=name)
    state_dir = state_dir or default_state_dir()
    info = read_json(state_dir / "head.json")
    if info is None or not recorded_alive(info):
        raise HeadUnavailableError(
            f"no head running from {state_dir}: start one with `farm head start`, pass --head HOST:PORT or "
            "--profile NAME, or set FARM_HEAD"
        )
    tls = bool(info.get("tls"))
    return HeadInfo(address=info["address"], api_token=token or info["api_token"], join_token=info["join_token"],
                    pid=int(info["pid"]), tls=tls, ca_pem=_read_ca(Path(info["ca"])) if tls else None,
                    ca_hash=str(info.get("ca_hash", "")))


def _read_ca(path: Path) -> bytes:
    try:
        return path.expanduser().read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the head's CA certificate {path}: {exc.strerror}") from None


def open_channel(head: HeadInfo, options: list[tuple[str, int]] | None = None) -> grpc.Channel:
    """A channel to the head: TLS against its CA unless it runs without TLS."""
    if not head.tls:
        return grpc.insecure_channel(head.address, options=options)
    return grpc.secure_channel(head.address, grpc.ssl_channel_credentials(head.ca_pem), options=options)


class Client:
    def __init__(self, head: HeadInfo | None = None, timeout: float = 30.0) -> None:
        head = head or find_head()  # none given: the local head (FARM_STATE_DIR), as the CLI finds it
        self.head = head
        self.timeout = timeout
        self.channel = open_channel(
            head, [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)],
        )
        self.jobs = job_pb2_grpc.JobServiceStub(self.channel)
        self.fleet = fleet_pb2_grpc.FleetServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {head.api_token}"),)

    @classmethod
    def local(cls, state_dir: Path | None = None) -> Client:
        return cls(find_head(state_dir=state_dir))

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: grpc.UnaryUnaryMultiCallable, request: object) -> object:
        try:
            return method(request, metadata=self.metadata, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.RpcError) -> FarmError:
        code = exc.code()
        details = str(exc.details())
        if code is grpc.StatusCode.UNAVAILABLE:
            return HeadUnavailableError(_unavailable(self.head, details) + self._through())
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return HeadUnavailableError(f"the head at {self.head.address} did not answer in time{self._through()}")
        error_class = ERRORS_BY_STATUS.get(code.name, FarmError)
        through = self._through() if code is grpc.StatusCode.UNAUTHENTICATED else ""
        return error_class(details + through)

    def _through(self) -> str:
        """Where this head was found, when a profile named it: a head that does not answer or refuses the token is
        then that profile's to fix."""
        if not self.head.profile:
            return ""
        from farm.client.config import config_path

        return f" (profile {self.head.profile!r} in {config_path()})"

    def submit(self, spec_yaml: str, code_zip: bytes, items: int, output: str, model_bytes: int = 0,
               overwrite: bool = False, dataset_location: str = "") -> str:
        request = job_pb2.SubmitRequest(spec_yaml=spec_yaml, items=items, output=output, model_bytes=model_bytes,
                                        overwrite=overwrite, dataset_location=dataset_location)
        if len(code_zip) <= INLINE_CODE:
            request.code_zip = code_zip
        else:  # the head takes no large message at once: the code goes ahead in chunks
            chunks = (job_pb2.CodeChunk(data=code_zip[at:at + INLINE_CODE])
                      for at in range(0, len(code_zip), INLINE_CODE))
            try:
                upload = self.jobs.UploadCode(chunks, metadata=self.metadata, timeout=max(self.timeout, 600.0))
            except grpc.RpcError as exc:
                raise self._error(exc) from None
            request.code_upload = upload.upload_id
        reply = self._call(self.jobs.Submit, request)
        return str(reply.job_id)  # type: ignore[attr-defined]

    def submit_prepared(self, job: PreparedJob, overwrite: bool = False) -> str:
        """Submit what `preflight.prepare` checked and packed (`overwrite`: its output folder may hold another job's
        results, which the head removes first)."""
        return self.submit(job.spec_yaml, job.code_zip, job.items, str(job.output), job.model_bytes, overwrite,
                           job.dataset_location)

    def job(self, job_id: str) -> job_pb2.Job:
        return self._call(self.jobs.Get, job_pb2.GetJobRequest(job_id=job_id))  # type: ignore[return-value]

    def resolve_job(self, ref: str) -> str:
        """The id of the job `ref` names: its whole id, or the start of one (with or without `j-`) that only one of
        the latest PREFIX_SEARCH jobs has. NotFoundError if none has it, UserError if several do."""
        if FULL_JOB_ID.fullmatch(ref):
            return ref
        ids = [j.id for j in self.list_jobs(limit=PREFIX_SEARCH)]
        return _unique_prefix("job", ref, ids, [i.removeprefix("j-") for i in ids])

    def resolve_node(self, ref: str) -> str:
        """What names the node `ref` names to the head: `ref` itself when it is a node's whole id or its name, else
        the id that `ref` starts (with or without `n-`), when only one node's does."""
        nodes = self.nodes()
        if any(ref in (n.id, n.name) for n in nodes):
            return ref
        return _unique_prefix("node", ref, [n.id for n in nodes], [n.id.removeprefix("n-") for n in nodes])

    def list_jobs(self, limit: int = 100) -> list[job_pb2.Job]:
        return list(self._call(self.jobs.List, job_pb2.ListJobsRequest(limit=limit)).jobs)  # type: ignore[attr-defined]

    def cancel(self, job_id: str) -> job_pb2.Job:
        return self._call(self.jobs.Cancel, job_pb2.CancelJobRequest(job_id=job_id))  # type: ignore[return-value]

    def retry_missing(self, job_id: str) -> job_pb2.Job:
        """Run a job that ended (failed, cancelled, or succeeded with rows skipped) again for only its shards without
        a result, into the same output; the job as it is now (running). ConflictError: it has not ended, or misses
        nothing."""
        request = job_pb2.RetryMissingRequest(job_id=job_id)
        return self._call(self.jobs.RetryMissing, request)  # type: ignore[return-value]

    def delete_jobs(self, job_ids: list[str], outputs: bool = False) -> list[job_pb2.DeletedJob]:
        request = job_pb2.DeleteJobsRequest(job_ids=job_ids, outputs=outputs)
        return list(self._call(self.jobs.Delete, request).jobs)  # type: ignore[attr-defined]

    def prune_jobs(self, older_than_s: float = 0.0, states: list[str] | None = None, outputs: bool = False
                   ) -> list[job_pb2.DeletedJob]:
        request = job_pb2.PruneJobsRequest(older_than_s=older_than_s, states=states or [], outputs=outputs)
        return list(self._call(self.jobs.Prune, request).jobs)  # type: ignore[attr-defined]

    def logs(self, job_id: str, shard: int | None = None, after: int = 0) -> list[job_pb2.LogLine]:
        """The job's log (with `shard`: that shard's lines only; `after` a line's id: the lines since)."""
        request = job_pb2.LogsRequest(job_id=job_id, shard=shard, after=after)
        return list(self._call(self.jobs.Logs, request).lines)  # type: ignore[attr-defined]

    def follow_logs(self, job_id: str, shard: int | None = None, after: int = 0) -> Iterator[job_pb2.LogLine]:
        """The job's log lines so far, then each new one as it is written, until the job ends."""
        request = job_pb2.LogsRequest(job_id=job_id, shard=shard, after=after)
        try:
            yield from self.jobs.FollowLogs(request, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def nodes(self) -> list[fleet_pb2.Node]:
        return list(self._call(self.fleet.ListNodes, fleet_pb2.ListNodesRequest()).nodes)  # type: ignore[attr-defined]

    def drain_node(self, node: str, drain: bool = True) -> fleet_pb2.Node:
        """Drain (or, with drain=False, undrain) the node with this id or name; the node as it is now."""
        request = fleet_pb2.DrainNodeRequest(node=node, drain=drain)
        return self._call(self.fleet.DrainNode, request)  # type: ignore[return-value]

    def evaluate_kernels(self, problems: Problems, candidates: Candidates, *, reward: str = "speedup",
                         backends: Sequence[str] = ("cuda",), timeout_s: float = 60.0, memory_mb: int | None = 4096,
                         runs: int = 20, atol: float = 1e-4, rtol: float = 1e-4) -> list[KernelResult]:
        """Judge candidate kernels on the fleet with the hardened evaluator, as one kernel-eval job; blocks until it
        ends. problems: a folder, files, or {stem: file or source}; candidates: a folder of <stem>/*.py, or {problem
        stem: [file or source, ...]}. One KernelResult per (problem, candidate), reward included."""
        from farm.client import kernels

        return kernels.evaluate(self, problems, candidates, reward=reward, backends=tuple(backends),
                                timeout_s=timeout_s, memory_mb=memory_mb, runs=runs, atol=atol, rtol=rtol)

    def results(self, job_id: str) -> ResultBatches:
        """The job's results so far as Arrow record batches (iterate), or `.to_table()` / `.to_pandas()`."""
        from farm.client.results import stream

        return stream(self, job_id)

    def watch(self, job_id: str) -> Iterator[job_pb2.Job]:
        """The job's record now and after each change, until it finishes."""
        try:
            yield from self.jobs.Watch(job_pb2.WatchJobRequest(job_id=job_id), metadata=self.metadata)
        except grpc.RpcError as exc:
            raise self._error(exc) from None


def _unavailable(head: HeadInfo, details: str) -> str:
    """Why a head is out of reach, in one line: a TLS trust failure (gRPC's details name the handshake's error) is not
    a head that does not answer, and is fixed otherwise."""
    trusted = "the CA it was given (--ca, FARM_CA or the profile's ca_file)" if head.ca_pem else "the system's roots"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (f"TLS trust failure: the head at {head.address} answers, but its certificate is not signed by "
                f"{trusted}; pass --ca (or set FARM_CA) with the head's tls/ca.pem")
    if "handshake failed" in details.lower():  # not a certificate: a head without TLS, say
        return (f"the TLS handshake with the head at {head.address} failed (a head started with --insecure takes "
                "FARM_INSECURE=1, or a profile added with --insecure)")
    if "not in peer certificate" in details:
        return (f"TLS trust failure: the head's certificate does not name {head.address.rsplit(':', 1)[0]}; connect "
                "to a name it has, or start the head with --tls-name for this one")
    return f"the head at {head.address} does not answer"


def _unique_prefix(what: str, ref: str, ids: list[str], bare: list[str]) -> str:
    """The one id of `ids` that starts with `ref` (or whose `bare` form does); else one line saying why not."""
    matches = [i for i, b in zip(ids, bare, strict=True) if ref and (i.startswith(ref) or b.startswith(ref))]
    if not matches:
        raise NotFoundError(f"no {what} {ref!r}")
    if len(matches) > 1:
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise UserError(f"{what} id {ref!r} is ambiguous: {len(matches)} {what}s start so ({shown}); give more of it")
    return matches[0]


def through_restarts(open_stream: Callable[[], Iterator[T]], patience_s: float = 120.0,
                     on_down: Callable[[], None] = lambda: None) -> Iterator[T]:
    """A stream from the head, opened again while the head is away (a crash, an upgrade: its service manager starts
    it again on its address) for up to `patience_s`; `open_stream` resumes where the caller left off. `on_down` is
    told once per outage."""
    down_since: float | None = None
    while True:
        try:
            for item in open_stream():
                down_since = None
                yield item
            return
        except HeadUnavailableError:
            if down_since is None:
                down_since = time.monotonic()
                on_down()
            elif time.monotonic() - down_since > patience_s:
                raise
            time.sleep(1.0)
