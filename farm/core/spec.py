"""Job specs: parsing and validation of the YAML a user submits. Pure: text in, a frozen JobSpec or a SpecError out."""

from __future__ import annotations

import difflib
import re
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, get_args

import yaml
from pydantic import (
    BaseModel, Discriminator, Field, Tag, TypeAdapter, ValidationError, field_validator, model_validator,
)

from farm.core import yaml_strict
from farm.core.backends import BACKENDS
from farm.core.energy import EnergyBasis
from farm.core.dataset import DatasetSpec
from farm.core.errors import SpecError
from farm.core.frozen import Frozen
from farm.core.kernels import RewardMode
from farm.core.models import BackendName

CALLABLE_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
DATA_FILE_SUFFIXES = (".npy", ".npz", ".pt")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MAX_SHARDS = 10_000
MAX_STEPS = 10_000_000  # a training job's steps, given or from its epochs
MAX_ENV = 64
MAX_REQUIREMENTS = 64
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV = ("RAY_", "FARM_")  # Ray's own and Farm's: a job does not steer its node through them
URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Where results may go besides the head's disk: an S3-compatible bucket, for the kinds that write there
# (`bucket_output`); any other URI is one clear line rather than a folder named "s3:".
OUTPUT_SCHEMES: tuple[str, ...] = ("s3://",)


class JobKind(StrEnum):
    INFERENCE = "inference"
    TRAINING = "training"
    KERNEL_EVAL = "kernel-eval"
    EVALUATE = "evaluate"


KINDS = tuple(k.value for k in JobKind)


class Policy(StrEnum):
    EFFICIENCY = "efficiency"
    THROUGHPUT = "throughput"
    DEADLINE = "deadline"


class Tolerance(Frozen):
    atol: float = Field(default=1e-4, ge=0)
    rtol: float = Field(default=1e-4, ge=0)


class SyncMode(StrEnum):
    SYNC = "sync"  # every step: gradients summed over all workers, one global batch split by measured speed
    LOCAL_SGD = "local-sgd"  # local steps; every sync_every steps parameters averaged, weighted by samples seen


class Optimizer(StrEnum):
    SGD = "sgd"
    ADAM = "adam"
    ADAMW = "adamw"


class Training(Frozen):
    """What a `kind: training` job adds: how to train, for how long, on how many workers."""

    loss: str = "cross_entropy"  # cross_entropy | mse | package.module:callable(outputs, targets) -> mean loss
    optimizer: Optimizer = Optimizer.ADAM
    lr: float = Field(default=1e-3, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)  # sgd only
    weight_decay: float = Field(default=0.0, ge=0)
    steps: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    epochs: float | None = Field(default=None, gt=0, le=100_000)
    workers: int = Field(default=2, ge=1, le=1024)  # at most this many devices train together
    sync: SyncMode = SyncMode.SYNC
    sync_every: int = Field(default=8, ge=1)  # local-sgd: local steps between parameter averages
    checkpoint_every: int = Field(default=50, ge=1)  # steps between checkpoints (and rebalancing)
    eval_dataset: str | None = None  # scored at each checkpoint and at the end (accuracy when it has labels)
    seed: int = 0

    @field_validator("loss")
    @classmethod
    def _loss(cls, value: str) -> str:
        if value not in LOSSES and not CALLABLE_PATH.match(value):
            raise ValueError(f"{value!r} is none of {', '.join(LOSSES)} nor package.module:callable")
        return value

    @field_validator("eval_dataset")
    @classmethod
    def _eval_dataset(cls, value: str | None) -> str | None:
        if value is not None and not CALLABLE_PATH.match(value):
            raise ValueError(f"{value!r} is not of the form package.module:callable")
        return value

    @model_validator(mode="after")
    def _length(self) -> Training:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of steps and epochs")
        return self

    def total_steps(self, items: int, batch_size: int) -> int:
        if self.steps is not None:
            return self.steps
        return max(1, round((self.epochs or 0) * items / batch_size))


LOSSES = ("cross_entropy", "mse")


class KernelEval(Frozen):
    """What a `kind: kernel-eval` job adds: folders of problems and candidates (candidates/<problem stem>/*.py),
    judged by the hardened evaluator on the job's backends (cuda or cpu)."""

    problems: str  # folder of problem files, relative to the working directory
    candidates: str  # folder of <problem stem>/<name>.py candidate files
    reward: RewardMode = RewardMode.SPEEDUP
    margin: float = Field(default=0.05, ge=0, le=10)  # milestones: "faster" means faster by more than this
    timeout_s: float = Field(default=60.0, gt=0, le=3600)  # per candidate, its compile included
    memory_mb: int | None = Field(default=4096, ge=64)  # per candidate: its GPU memory share, or its RSS on a CPU
    runs: int = Field(default=20, ge=1, le=10_000)  # timed runs per candidate; the median is reported
    candidates_per_shard: int = Field(default=16, ge=1, le=10_000)  # a shard holds one problem's candidates


KERNEL_EVAL_BACKENDS = tuple(name.value for name, traits in BACKENDS.items() if traits.kernel_eval)


class SpecBase(Frozen):
    """What every kind of job says: its name, how to shard it, where it may run and where its output goes."""

    name: str
    shards: int = Field(default=1, ge=1, le=MAX_SHARDS)
    batch_size: int = Field(default=64, ge=1, le=1_000_000)
    backends: tuple[BackendName, ...] = tuple(BackendName)
    policy: Policy = Policy.EFFICIENCY
    deadline_s: float | None = Field(default=None, gt=0)
    # What the efficiency policy ranks devices by: energy above their idle draw (default), or all they drew.
    energy: EnergyBasis = EnergyBasis.MARGINAL
    tolerance: Tolerance = Tolerance()
    output: str | None = None  # a folder on the head's machine; or a bucket (s3://) where the kind writes one
    bucket_output: ClassVar[bool] = False
    # The job's environment on the nodes: variables of its processes, and pip requirements installed on each node
    # once per distinct set (farm_agent.work.environment), from `find_links` alone when given (a folder on every node
    # or an http(s) URL of wheels: nodes without the internet), else from the node's own pip configuration.
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV)
    requirements: tuple[str, ...] = Field(default=(), max_length=MAX_REQUIREMENTS)
    find_links: str | None = Field(default=None, min_length=1, max_length=1024)

    @model_validator(mode="before")
    @classmethod
    def _sections_of_other_kinds(cls, data: Any) -> Any:
        """A section another kind reads, named here, says so (rather than "unknown field")."""
        if isinstance(data, dict):
            for section in SECTIONS:
                if section in data and section not in cls.model_fields:
                    kind = data.get("kind", JobKind.INFERENCE.value)
                    raise ValueError(f"a '{section}' section does not go with kind '{kind}'")
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError("must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_scalars(cls, value: Any) -> Any:
        """`OMP_NUM_THREADS: 4` in YAML is a number: a variable's value is its text."""
        if isinstance(value, dict):
            return {k: str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, (int, float)) else v
                    for k, v in value.items()}
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a variable name (letters, digits and '_')")
            if name.upper().startswith(RESERVED_ENV):
                raise ValueError(f"{name!r}: names starting with {' or '.join(RESERVED_ENV)} are Ray's and Farm's")
            if len(text) > 4096 or "\0" in text:
                raise ValueError(f"{name}: a value of at most 4096 characters, without NUL")
        return value

    @field_validator("requirements", mode="before")
    @classmethod
    def _requirements(cls, value: Any) -> Any:
        from packaging.requirements import InvalidRequirement, Requirement

        for line in [value] if isinstance(value, str) else value or ():
            if not isinstance(line, str) or len(line) > 256 or line.lstrip().startswith("-"):
                raise ValueError(f"{line!r}: one requirement a line, as pip reads them (no options)")
            try:
                Requirement(line)
            except InvalidRequirement as exc:
                raise ValueError(f"{line!r} is not a requirement pip reads: {str(exc).splitlines()[0]}") from None
        return (value,) if isinstance(value, str) else value

    @field_validator("output")
    @classmethod
    def _output(cls, value: str | None) -> str | None:
        if value is not None and URI_SCHEME.match(value):
            scheme = value.split("://", 1)[0]
            if not value.startswith(OUTPUT_SCHEMES):
                raise ValueError(f"{value!r}: {scheme}:// outputs are not supported yet; give a folder on the head's "
                                 "machine (or s3://bucket/prefix for an inference job)")
            if not cls.bucket_output:
                raise ValueError(f"{value!r}: this kind writes its outputs to a folder on the head's machine")
            if not value.removeprefix(f"{scheme}://").strip("/"):
                raise ValueError(f"{value!r} names no bucket")
        return value

    @field_validator("backends", mode="before")
    @classmethod
    def _one_backend(cls, value: Any) -> Any:
        """`backends: cpu` is a list of one."""
        return (value,) if isinstance(value, str) else value

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: tuple[BackendName, ...]) -> tuple[BackendName, ...]:
        if not value:
            raise ValueError("must allow at least one backend")
        return tuple(dict.fromkeys(value))

    @model_validator(mode="after")
    def _deadline(self) -> SpecBase:
        if self.policy is Policy.DEADLINE and self.deadline_s is None:
            raise ValueError("policy 'deadline' needs deadline_s")
        return self

    @property
    def output_dir(self) -> str:
        return self.output or f"out/{self.name}"


SECTIONS = ("training", "kernel_eval")  # the kind-specific sections


class ModelJobSpec(SpecBase):
    """A kind that runs a model over a dataset."""

    model: str  # package.module:callable returning a torch.nn.Module
    weights: str | None = None  # a state_dict inside the job's code
    dataset: str  # package.module:callable, or a .npy, .npz or .pt file inside the job's code
    # The error budget, as Ray Data's max_errored_blocks: rows that do not read (a corrupt row group, an image that does
    # not decode) are skipped and listed in the manifest, and the job still succeeds while they are at most
    # max_bad_rows, or max_failed_fraction of its rows (the larger). Default 0: any skipped row fails the job, once
    # its other rows are done (farm job ID --retry-missing runs only what is missing).
    max_bad_rows: int = Field(default=0, ge=0)
    max_failed_fraction: float = Field(default=0.0, ge=0, le=1)

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not CALLABLE_PATH.match(value):
            raise ValueError(f"{value!r} is not of the form package.module:callable")
        return value

    @field_validator("dataset", mode="before")
    @classmethod
    def _located(cls, value: Any) -> Any:
        if isinstance(value, dict):
            raise ValueError("a dataset by location is read by inference jobs; this kind takes package.module:callable"
                             " or a .npy, .npz or .pt file")
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str | DatasetSpec) -> str | DatasetSpec:
        if isinstance(value, str) and not (CALLABLE_PATH.match(value) or value.endswith(DATA_FILE_SUFFIXES)):
            raise ValueError(f"{value!r} is neither package.module:callable nor a .npy, .npz or .pt file")
        return value

    @property
    def dataset_is_file(self) -> bool:
        """A .npy/.npz/.pt file inside the job's code."""
        return isinstance(self.dataset, str) and not CALLABLE_PATH.match(self.dataset)

    @property
    def located_dataset(self) -> DatasetSpec | None:
        """The dataset by location and format, streamed by the nodes; None: a callable or a file in the code."""
        return self.dataset if isinstance(self.dataset, DatasetSpec) else None

    @property
    def datasets(self) -> tuple[str, ...]:
        """Every dataset in the job's code it reads (a client checks each loads before submitting)."""
        return (self.dataset,) if isinstance(self.dataset, str) else ()


def _dataset_form(value: Any) -> str:
    return "located" if isinstance(value, (dict, DatasetSpec)) else "in-code"


DATASET_FORMS = ("located", "in-code")  # the tags of InferenceSpec.dataset's union: not fields, left out of errors


class InferenceSpec(ModelJobSpec):
    kind: Literal[JobKind.INFERENCE] = JobKind.INFERENCE
    bucket_output: ClassVar[bool] = True  # its Parquet results go to a folder or a bucket alike (farm.data.results)
    # N fixed shards, or "auto": cut as the job runs, each sized to last a target time on the device it goes to
    # (farm.scheduler.sizing). Unset: auto for a dataset given by location (a mapping), else 1.
    shards: int | Literal["auto"] = 1  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _default_shards(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("shards") is None:
            return {**data, "shards": "auto" if isinstance(data.get("dataset"), dict) else 1}
        return data

    @field_validator("shards", mode="before")
    @classmethod
    def _shards(cls, value: object) -> object:
        if value == "auto" or (type(value) is int and 1 <= value <= MAX_SHARDS):
            return value
        raise ValueError(f"must be a number of shards from 1 to {MAX_SHARDS:,}, or auto")

    @property
    def auto_shards(self) -> bool:
        return self.shards == "auto"

    @property
    def fixed_shards(self) -> int:
        """The shards cut at submit: N; auto-sized jobs cut none then."""
        return self.shards if isinstance(self.shards, int) else 0
    # Also a location and format (farm.core.dataset), which the nodes stream: only inference reads those so far.
    dataset: Annotated[Annotated[DatasetSpec, Tag("located")] | Annotated[str, Tag("in-code")],  # type: ignore[assignment]
                       Discriminator(_dataset_form)]

    @field_validator("dataset", mode="before")
    @classmethod
    def _located(cls, value: Any) -> Any:  # replaces ModelJobSpec's: here a mapping is welcome
        return value
    # Tune the model's kernels on each GPU before its first shard there (farm kernels tune), within this budget;
    # without it a GPU runs the tuner's cached winner when it has one, else eager PyTorch.
    tune_budget_s: float | None = Field(default=None, gt=0, le=3600)


class TrainingSpec(ModelJobSpec):
    """batch_size is the global batch, split over the workers by their measured speed."""

    kind: Literal[JobKind.TRAINING]
    training: Training

    @model_validator(mode="before")
    @classmethod
    def _has_section(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("training") is None:
            raise ValueError("kind 'training' needs a 'training' section (loss, optimizer, steps or epochs, ...)")
        return data

    @property
    def datasets(self) -> tuple[str, ...]:
        return (self.dataset, *([self.training.eval_dataset] if self.training.eval_dataset else []))


class EvaluateSpec(ModelJobSpec):
    """A model scored over a labelled dataset: accuracy and loss, per device and over all; no outputs written."""

    kind: Literal[JobKind.EVALUATE]
    loss: str = "cross_entropy"  # cross_entropy | mse | package.module:callable(outputs, targets) -> mean loss

    @field_validator("loss")
    @classmethod
    def _loss(cls, value: str) -> str:
        if value not in LOSSES and not CALLABLE_PATH.match(value):
            raise ValueError(f"{value!r} is none of {', '.join(LOSSES)} nor package.module:callable")
        return value


class KernelEvalSpec(SpecBase):
    kind: Literal[JobKind.KERNEL_EVAL]
    kernel_eval: KernelEval

    @model_validator(mode="before")
    @classmethod
    def _has_section(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kernel_eval") is None:
            raise ValueError("kind 'kernel-eval' needs a 'kernel_eval' section (problems, candidates, ...)")
        return data

    @model_validator(mode="after")
    def _runs_somewhere(self) -> KernelEvalSpec:
        if not self.kernel_eval_backends:
            raise ValueError(f"kind 'kernel-eval' runs on {' or '.join(KERNEL_EVAL_BACKENDS)}: "
                             "allow one of them in backends")
        return self

    @property
    def kernel_eval_backends(self) -> tuple[BackendName, ...]:
        """The allowed backends the kernel evaluator can run on."""
        return tuple(b for b in self.backends if b.value in KERNEL_EVAL_BACKENDS)


def _kind_of(data: Any) -> str | None:
    """The union's tag: a spec's `kind`, inference when it gives none."""
    if isinstance(data, dict):
        kind = data.get("kind", JobKind.INFERENCE.value)
        return kind if isinstance(kind, str) else None
    return getattr(data, "kind", None)


# A job spec: one model per kind, chosen by `kind`. Adding a kind: its JobKind member, its model here, a line below.
JobSpec = Annotated[
    Annotated[InferenceSpec, Tag(JobKind.INFERENCE.value)]
    | Annotated[TrainingSpec, Tag(JobKind.TRAINING.value)]
    | Annotated[KernelEvalSpec, Tag(JobKind.KERNEL_EVAL.value)]
    | Annotated[EvaluateSpec, Tag(JobKind.EVALUATE.value)],
    Discriminator(_kind_of, custom_error_type="kind", custom_error_message="must be one of "
                  + ", ".join(k.value for k in JobKind)),
]
_SPEC: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)


def parse_spec(text: str, source: str = "spec") -> JobSpec:
    """Parse and validate a job spec; every problem becomes a one-line SpecError naming `source` and the field."""
    try:
        data: Any = yaml_strict.load(text)  # no aliases: nested ones multiply
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise SpecError(f"{source}: not valid YAML{where}: {problem}") from None
    except RecursionError:  # PyYAML parses nesting recursively: "[[[[..." a few hundred deep exhausts the stack
        raise SpecError(f"{source}: not valid YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return _SPEC.validate_python(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_first_problem(exc, data)}") from None


# What a field of each shape holds, said in words where pydantic names a Python type ("Input should be a valid
# tuple"): by the error's type; the list's items by field, as a user calls them.
EXPECTED = {
    "tuple_type": "a list", "list_type": "a list", "dict_type": "a mapping (name: value lines)",
    "model_type": "a mapping (name: value lines)", "model_attributes_type": "a mapping (name: value lines)",
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "text",
}
LIST_OF = {"backends": "backends (cuda, ane, mps, cpu)", "requirements": "requirements, one a line as pip reads them"}


def _first_problem(exc: ValidationError, data: Any = None) -> str:
    error = exc.errors()[0]
    loc = error["loc"][1:] if error["loc"] and error["loc"][0] in KINDS else error["loc"]  # the union's tag first
    loc = tuple(part for part in loc if part not in DATASET_FORMS)
    field = ".".join(_one_line(str(part)) for part in loc) or "spec"
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _known_fields(data, loc), n=1, cutoff=0.6) if loc else []
        return f"unknown field '{field}'" + (f": did you mean '{close[0]}'?" if close else "")
    if error["type"] == "missing":
        return f"missing required field '{field}'"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] in EXPECTED:  # in words, not pydantic's types
        expected = EXPECTED[error["type"]]
        if expected == "a list" and str(loc[-1]) in LIST_OF:
            expected = f"a list of {LIST_OF[str(loc[-1])]}"
        message = f"expected {expected}, got {_shown(error.get('input'))}"
    elif error["type"] == "enum":
        message = f"must be one of {error.get('ctx', {}).get('expected', '')}, not {_shown(error.get('input'))}"
    else:
        message = message.replace("Input should be", "must be")
    more = f" (and {len(exc.errors()) - 1} more problems)" if len(exc.errors()) > 1 else ""
    if error["type"] == "kind":
        return f"field 'kind': {message}{more}"
    return f"field '{field}': {message}{more}" if loc else f"{message}{more}"


def _one_line(text: str) -> str:
    """A key from the spec, its line breaks and other control characters escaped (a message is one line)."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _shown(value: Any) -> str:
    """A value from the spec as the user wrote it, on one line, cut short."""
    if isinstance(value, str):
        text = repr(value)
    elif isinstance(value, (dict, list, int, float, bool)) or value is None:
        dumped = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...")
        text = " ".join(dumped.split())  # YAML breaks a key that holds a line break over lines
    else:
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _known_fields(data: Any, loc: tuple[Any, ...]) -> list[str]:
    """The fields the spec's model for `data`'s kind has where `loc` ends (a section's, for a nested key)."""
    kind = _kind_of(data)
    model: Any = next((get_args(member)[0] for member in get_args(get_args(JobSpec)[0])
                       if get_args(member)[1].tag == kind), None)
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is None:
            return []
        model = next((t for t in (field.annotation, *get_args(field.annotation))
                      if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return list(model.model_fields) if model is not None else []


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
