"""A job's dataset on the head: its spec and plan (made at submission, kept in the job's folder beside its code, as
immutable as the job's code), and the job's read credential, the token its shards present to the head's
DataService to read a dataset on the head's machine."""

from __future__ import annotations

import hmac
import json
import os
import secrets
from functools import lru_cache
from pathlib import Path

from farm.core.dataset import DatasetPlan, DatasetSpec, Location
from farm.core.errors import SpecError
from farm.local import write_private

PLAN = "dataset.json"
READ_TOKEN = "read-token"


def job_dir(state_dir: Path, job_id: str) -> Path:
    return state_dir / "jobs" / job_id


def check_location(spec: DatasetSpec, state_dir: Path) -> None:
    """A path on the head's machine may name any data of the head's admin (who holds the API token), but never the
    head's own state folder: its secrets, its store, other jobs' code."""
    if spec.kind is not Location.HEAD:
        return
    if not os.path.isabs(spec.location):
        raise SpecError(f"dataset {spec.location!r}: a path on the head's machine must be absolute")
    if inside(Path(spec.location), state_dir):
        raise SpecError(f"dataset {spec.location!r} is inside the head's state folder")


def inside(path: Path, folder: Path) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root


def save(state_dir: Path, job_id: str, spec: DatasetSpec, plan: DatasetPlan) -> None:
    folder = job_dir(state_dir, job_id)
    write_private(folder / PLAN, json.dumps({"spec": spec.model_dump(mode="json"),
                                             "plan": plan.model_dump(mode="json")}).encode())
    if spec.kind is Location.HEAD:
        write_private(folder / READ_TOKEN, secrets.token_urlsafe(24).encode())


@lru_cache(maxsize=256)
def load(state_dir: Path, job_id: str) -> tuple[DatasetSpec, DatasetPlan] | None:
    """The job's dataset spec and plan; None for a job without one (a callable or a file in its code)."""
    try:
        saved = json.loads((job_dir(state_dir, job_id) / PLAN).read_bytes())
    except FileNotFoundError:
        return None
    return DatasetSpec.model_validate(saved["spec"]), DatasetPlan.model_validate(saved["plan"])


def read_token(state_dir: Path, job_id: str) -> str | None:
    try:
        return (job_dir(state_dir, job_id) / READ_TOKEN).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def token_matches(presented: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(presented.encode(), expected.encode())
