"""Job specs: parsing and validation of the YAML a user submits. Pure: text in, a frozen JobSpec or a SpecError out."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from farm.core.errors import SpecError
from farm.core.frozen import Frozen
from farm.core.models import BackendName

CALLABLE_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
DATA_FILE_SUFFIXES = (".npy", ".npz", ".pt")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MAX_SHARDS = 10_000


class JobKind(StrEnum):
    INFERENCE = "inference"
    TRAINING = "training"
    KERNEL_EVAL = "kernel-eval"


class Policy(StrEnum):
    EFFICIENCY = "efficiency"
    THROUGHPUT = "throughput"
    DEADLINE = "deadline"


class Tolerance(Frozen):
    atol: float = Field(default=1e-4, ge=0)
    rtol: float = Field(default=1e-4, ge=0)


class JobSpec(Frozen):
    name: str
    kind: JobKind = JobKind.INFERENCE
    model: str
    weights: str | None = None
    dataset: str
    shards: int = Field(default=1, ge=1, le=MAX_SHARDS)
    batch_size: int = Field(default=64, ge=1, le=1_000_000)
    backends: tuple[BackendName, ...] = tuple(BackendName)
    policy: Policy = Policy.EFFICIENCY
    deadline_s: float | None = Field(default=None, gt=0)
    tolerance: Tolerance = Tolerance()
    output: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError("must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not CALLABLE_PATH.match(value):
            raise ValueError(f"{value!r} is not of the form package.module:callable")
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        if not (CALLABLE_PATH.match(value) or value.endswith(DATA_FILE_SUFFIXES)):
            raise ValueError(f"{value!r} is neither package.module:callable nor a .npy, .npz or .pt file")
        return value

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: tuple[BackendName, ...]) -> tuple[BackendName, ...]:
        if not value:
            raise ValueError("must allow at least one backend")
        return tuple(dict.fromkeys(value))

    @model_validator(mode="after")
    def _deadline(self) -> JobSpec:
        if self.policy is Policy.DEADLINE and self.deadline_s is None:
            raise ValueError("policy 'deadline' needs deadline_s")
        return self

    @property
    def dataset_is_file(self) -> bool:
        return not CALLABLE_PATH.match(self.dataset)

    @property
    def output_dir(self) -> str:
        return self.output or f"out/{self.name}"


def parse_spec(text: str, source: str = "spec") -> JobSpec:
    """Parse and validate a job spec; every problem becomes a one-line SpecError naming `source` and the field."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise SpecError(f"{source}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_first_problem(exc)}") from None


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"]) or "spec"
    if error["type"] == "extra_forbidden":
        return f"unknown field '{field}'"
    if error["type"] == "missing":
        return f"missing required field '{field}'"
    message = str(error["msg"]).removeprefix("Value error, ")
    more = f" (and {len(exc.errors()) - 1} more problems)" if len(exc.errors()) > 1 else ""
    return f"field '{field}': {message}{more}"


def shard_ranges(items: int, shards: int) -> list[tuple[int, int]]:
    """Split `items` into at most `shards` contiguous, near-equal [start, stop) ranges, none empty."""
    if items < 1:
        raise SpecError("the dataset is empty")
    count = min(shards, items)
    base, extra = divmod(items, count)
    ranges, start = [], 0
    for index in range(count):
        stop = start + base + (1 if index < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges
