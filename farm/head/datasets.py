"""A job's dataset on the head: its spec and plan (made at submission, kept in the job's folder beside its code, as
immutable as the job's code), and the job's read credential, the token its shards present to the head's
DataService to read a dataset on the head's machine."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from functools import lru_cache
from pathlib import Path

from farm.core.dataset import DatasetPlan, DatasetSpec, Location
from farm.core.errors import NotFoundError, SpecError
from farm.core.tasks import HeadAccess
from farm.head.settings import HeadSettings
from farm.head.store import Store

PLAN = "dataset.json"
IDENTITY = "identity"  # in PLAN: each planned file's identity on the head's disk
READ_TOKEN = "read-token"


def job_dir(state_dir: Path, job_id: str) -> Path:
    return state_dir / "jobs" / job_id


def check_location(spec: DatasetSpec, state_dir: Path) -> None:
    """A path on the head's machine may name any data of the head's admin (who holds the API token), but never the
    head's own state folder: its secrets, its store, other jobs' code."""
    if spec.where is not Location.HEAD:
        return
    if not os.path.isabs(spec.location):
        raise SpecError(f"dataset {spec.location!r}: a path on the head's machine must be absolute")
    if inside(Path(spec.location), state_dir):
        raise SpecError(f"dataset {spec.location!r} is inside the head's state folder")


def inside(path: Path, folder: Path) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root


def files(spec: DatasetSpec, plan: DatasetPlan) -> dict[str, bytes]:
    """What the job's folder keeps of its dataset: the spec and plan, and for a dataset on this machine each planned
    file's identity (what DataService serves must be that very file) and the job's read credential (a fresh random
    token)."""
    saved: dict[str, object] = {"spec": spec.model_dump(mode="json"), "plan": plan.model_dump(mode="json")}
    kept: dict[str, bytes] = {}
    if spec.where is Location.HEAD:
        saved[IDENTITY] = identities(spec.location, plan)
        kept[READ_TOKEN] = secrets.token_urlsafe(24).encode()
    return {PLAN: json.dumps(saved).encode(), **kept}


def identities(root: str, plan: DatasetPlan) -> dict[str, tuple[int, int]]:
    """Each planned file's (st_dev, st_ino), as planned: a file put in its place since (a hard link to another file,
    a rewrite) is another file, and not served."""
    from farm.data.locations import join

    found = {}
    for planned in plan.files:
        try:
            info = os.lstat(join(root, planned.path))
        except OSError as exc:
            raise SpecError(f"dataset {root!r}: {planned.path or root!r} went while it was planned ({exc.strerror})"
                            ) from None
        found[planned.path] = (info.st_dev, info.st_ino)
    return found


@lru_cache(maxsize=256)
def load(state_dir: Path, job_id: str) -> tuple[DatasetSpec, DatasetPlan] | None:
    """The job's dataset spec and plan; None for a job without one (a callable or a file in its code)."""
    try:
        saved = json.loads((job_dir(state_dir, job_id) / PLAN).read_bytes())
    except FileNotFoundError:
        return None
    return DatasetSpec.model_validate(saved["spec"]), DatasetPlan.model_validate(saved["plan"])


@lru_cache(maxsize=256)
def planned_identities(state_dir: Path, job_id: str) -> dict[str, tuple[int, int]] | None:
    """The job's planned files' identities (files()); None for a job planned before they were kept."""
    try:
        saved = json.loads((job_dir(state_dir, job_id) / PLAN).read_bytes()).get(IDENTITY)
    except FileNotFoundError:
        return None
    return None if saved is None else {path: (int(dev), int(ino)) for path, (dev, ino) in saved.items()}


def read_token(state_dir: Path, job_id: str) -> str | None:
    try:
        return (job_dir(state_dir, job_id) / READ_TOKEN).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def plan_located(spec: DatasetSpec, location: str, state_dir: Path) -> tuple[DatasetSpec, DatasetPlan]:
    """At submit, in a worker thread (it reads footers and listings, maybe over the network): the dataset at the
    location the client resolved, and its plan."""
    from farm import data

    if location:
        spec = spec.model_copy(update={"location": location})
    check_location(spec, state_dir)
    if spec.where is Location.HEAD:  # resolved once, here: DataService then follows no link under it (issue 30)
        spec = spec.model_copy(update={"location": os.path.realpath(os.path.expanduser(spec.location))})
    return spec, data.plan(spec)


def access(settings: HeadSettings, job_id: str) -> HeadAccess | None:
    """How a node reads the job's dataset from this head; None when it lives elsewhere (http, s3)."""
    token = read_token(settings.state_dir, job_id)
    if token is None:
        return None
    ca_pem = b"" if settings.insecure else (settings.tls_dir / "ca.pem").read_bytes()
    return HeadAccess(address=settings.address, ca_pem=ca_pem, job_id=job_id, token=token,
                      data_address=settings.data_address, bulk_address=settings.bulk_address)


def describe(spec: DatasetSpec, plan: DatasetPlan) -> str:
    """The job log's `data:` line, which `farm job --explain` shows."""
    count = f"{plan.rows:,} rows" if plan.rows is not None else f"{plan.size:,} bytes of lines (ranges in bytes)"
    files = f"{len(plan.files):,} file{'s' if len(plan.files) != 1 else ''}"
    where = {Location.HEAD: "on the head's machine, served to the nodes by the head",
             Location.HTTP: "read by the nodes over http(s)", Location.S3: "read by the nodes from S3"}[spec.where]
    if plan.shared:
        where = ("on the head's machine: a node that sees its files at that path as planned (each one's size and "
                 "modification time: on the head's machine, or a shared filesystem) reads them itself, another "
                 "through the head")
    text = f"data: {plan.format.value} at {plan.location} ({where}): {count} in {files}, planned from metadata"
    if spec.preprocess:
        text += (f"; preprocess {spec.preprocess} runs on the nodes inside the energy window, streamed with the "
                 "model batch by batch (its time and energy count as the shard's; the node reads a few batches ahead "
                 "of the model, so reading overlaps compute)")
    return text


class ReadCredentials:
    """Whether a bearer is a job's read credential: for farm.head.gate, before a DataService call's body (which names
    the job) is read, so that a caller with any bearer cannot make the head read its messages. DataService then
    checks the credential against the job the body names, and that the job still runs (saying so when it has ended).
    Credentials are made at submit and never change: each is read once and kept, by its hash, while its job is on
    record. Only an unknown bearer makes it look again (a refusal, which the gate counts against the caller)."""

    def __init__(self, state_dir: Path, store: Store) -> None:
        self.state_dir = state_dir
        self.store = store
        self.known: dict[str, str] = {}  # sha256 of a credential → its job

    def admits(self, presented: str) -> bool:
        digest = hashlib.sha256(presented.encode()).hexdigest()
        if digest not in self.known:
            self._refresh()
        return digest in self.known

    def _refresh(self) -> None:
        """The unfinished jobs' credentials, and those known of jobs still on record."""
        live = set(self.store.unfinished_job_ids())
        kept = {digest: job for digest, job in self.known.items() if job in live or self._on_record(job)}
        for job_id in live - set(kept.values()):
            token = read_token(self.state_dir, job_id)
            if token:
                kept[hashlib.sha256(token.encode()).hexdigest()] = job_id
        self.known = kept

    def _on_record(self, job_id: str) -> bool:
        try:
            self.store.job_state(job_id)
        except NotFoundError:
            return False
        return True
