"""The contract between the head's dispatcher and the code that runs a shard on a node."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import ConfigDict

from farm.core.dataset import DatasetPlan, DatasetSpec, ReadRoute
from farm.core.energy import Energy
from farm.core.phases import ShardPhases
from farm.core.tuning import Objective, SharedWinner, TuningOutcome

# The attributes of an exception raised by a shard's code that carry what the shard printed and its formatted
# traceback (farm_agent.work.capture sets them; the shard's upload sends them to the head with its failure).
SHARD_LOG_ATTR = "farm_log"
SHARD_TRACEBACK_ATTR = "farm_traceback"  # from the user's first frame (Farm's own leading frames left out)
SHARD_FULL_TRACEBACK_ATTR = "farm_full_traceback"  # Farm's frames included (farm logs --verbose)
SHARD_ROWS_ATTR = "farm_rows"  # where in its shard a model's exception happened: "rows 0-99, the batch from row 64"
VERBOSE = "verbose"  # the job log's level of the full traceback, which only `farm logs --verbose` shows
# The worker environment variable through which the head hands a job's pip requirements to its shards' workers:
# JSON {"requirements": [...], "find_links": str | null} (farm_agent.work.environment installs them).
REQUIREMENTS_VAR = "FARM_REQUIREMENTS"
# A task's bytes (a CA's PEM) as base64 in its JSON (farm.core.wire).
_BYTES_AS_BASE64 = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


@dataclass(frozen=True)
class Tuning:
    """How far a faster implementation of the model may drift from it in fp32 (the job's tolerance), whether to
    tune before running (the CUDA backend's kernel tuner; other backends run the model as it is), what a winner
    must save (the job policy's objective) and over how many rows it can pay for its tuning."""

    atol: float = 1e-4
    rtol: float = 1e-4
    budget_s: float | None = None  # tune first, once per model, batch shape and GPU, within this many seconds
    objective: Objective = Objective.ENERGY  # the `efficiency` policy's, a job's default
    rows_left: int | None = None  # the job's rows not yet done when this shard was sent: caps the budget
    # The in-job A/B's side for this shard (farm.core.tuning.ab_verdict): True runs the model untuned and tunes
    # nothing (the eager side, or a job whose winner lost in its own shards).
    eager: bool = False
    shared: tuple[SharedWinner, ...] = ()  # winners other nodes found for this job's model: a fitting one is run
    # The device's idle draw as its agent read it on its energy counter: the job's energy is above it, and so a
    # tuning run's candidates' joules are (None: the tuning run reads it, 2 s of its budget).
    idle_w: float | None = None


@dataclass(frozen=True)
class HeadAccess:
    """How a node reads a job's dataset from the head's machine: the head's address and CA, and the job's read
    credential (it reaches that job's dataset files only)."""

    __pydantic_config__: ClassVar[ConfigDict] = _BYTES_AS_BASE64

    address: str
    ca_pem: bytes  # empty: a head without TLS
    job_id: str
    token: str
    data_address: str = ""  # the head's data port, where large reads go on several connections ("": `address`)
    bulk_address: str = ""  # the head's bulk port, where a large read's pieces go over plain TLS (farm.head.bulk)

    def __repr__(self) -> str:  # never a credential in a log or a traceback
        return f"HeadAccess(address={self.address!r}, job_id={self.job_id!r})"


@dataclass(frozen=True)
class ResultRoute:
    """Where and how a shard's attempt sends its result: the head's address and CA, and the attempt's upload ticket
    (a random token the head issued for this job, shard, attempt and node, void once the attempt ends). Results
    travel over the head's channel as Arrow IPC and protobuf (farm_agent.work.upload), never as a Ray return value,
    which the head would have to unpickle."""

    __pydantic_config__: ClassVar[ConfigDict] = _BYTES_AS_BASE64

    address: str
    ca_pem: bytes  # empty: a head without TLS
    ticket: str

    def __repr__(self) -> str:  # never a credential in a log or a traceback
        return f"ResultRoute(address={self.address!r})"


@dataclass(frozen=True)
class DataTask:
    """A shard's slice of a planned dataset: the spec (columns, preprocess), the plan's files holding its units,
    and, for a dataset on the head's machine, how to read it there."""

    spec: DatasetSpec
    plan: DatasetPlan
    access: HeadAccess | None = None


@dataclass(frozen=True)
class ShardTask:
    job_id: str
    index: int
    start: int
    stop: int
    model: str  # module:callable returning a torch.nn.Module
    weights: str | None  # state_dict path inside the job's code
    dataset: str  # module:callable or a data file inside the job's code; empty with `data`
    batch_size: int
    backend: str
    device: str
    threads: int
    tuning: Tuning = Tuning()
    data: DataTask | None = None  # a dataset by location and format, streamed through [start, stop)


@dataclass(frozen=True)
class ShardResult:
    """A shard's figures on its node; its results table (row_id, passthrough columns, the model's `output`) went to
    the runner's sink batch by batch (to the head, as Arrow IPC, for inference)."""

    items: int
    seconds: float  # time spent in the model, loading excluded
    correct: int | None  # predictions equal to the dataset's labels, when it has labels
    node_ray_id: str
    energy: Energy | None  # what the device spent over `seconds`; None where no meter could tell
    peak_memory_bytes: int = 0  # the most memory the shard took on its device (0: not measured)
    log: str = ""  # what the shard printed (stdout and stderr, bounded): farm_agent.work.capture fills it in
    # The energy, where its meter finds it after the shard (an NVML window's end edge, found while the worker's next
    # shard runs): `energy` is None until this is read (farm_agent.work.kinds.inference.attempt).
    energy_later: Callable[[], Energy | None] | None = None
    read_route: ReadRoute | None = None  # how the node read a located dataset (None: the data came with the code)
    tuning: TuningOutcome | None = None  # the forward it ran and the tuning it paid for (the cuda backend's)
    phases: ShardPhases | None = None  # where its time went on the node (farm.core.phases)


@dataclass(frozen=True)
class ShardFigures:
    """What one attempt of a shard measured, as its node sent it to the head (farm.proto.convert.figures_from_pb),
    for every kind alike; its table, if it has one, arrived beside it."""

    items: int
    seconds: float
    correct: int | None = None
    energy: Energy | None = None
    peak_memory_bytes: int = 0
    log: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)  # the kind's own figures (an evaluate shard's loss)
    tuning: TuningOutcome | None = None  # an inference shard's forward and its tuning (None: no tuner ran)


@dataclass(frozen=True)
class EvaluateTask:
    """A shard of an evaluate job: the model over the shard's rows, scored against their labels by `loss`."""

    shard: ShardTask
    loss: str  # cross_entropy | mse | package.module:callable(outputs, targets) -> mean loss


@dataclass(frozen=True)
class EvaluateResult:
    items: int
    seconds: float  # time spent in the model, loading and scoring excluded
    correct: int | None  # predictions equal to the labels (class scores only)
    loss: float  # the mean loss over the shard's rows
    node_ray_id: str
    energy: Energy | None
    peak_memory_bytes: int = 0
    log: str = ""  # what the shard printed (stdout and stderr, bounded): farm_agent.work.capture fills it in
