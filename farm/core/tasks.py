"""The contract between the head's dispatcher and the code that runs a shard on a node."""

from __future__ import annotations

from dataclasses import dataclass

from farm.core.dataset import DatasetPlan, DatasetSpec
from farm.core.energy import Energy

# The attributes of an exception raised by a shard's code that carry what the shard printed and its formatted
# traceback to the head (farm_agent.capture sets them; they travel in the exception's pickled __dict__).
SHARD_LOG_ATTR = "farm_log"
SHARD_TRACEBACK_ATTR = "farm_traceback"
# The worker environment variable through which the head hands a job's pip requirements to its shards' workers:
# JSON {"requirements": [...], "find_links": str | null} (farm_agent.environment installs them).
REQUIREMENTS_VAR = "FARM_REQUIREMENTS"


@dataclass(frozen=True)
class Tuning:
    """How far a faster implementation of the model may drift from it in fp32 (the job's tolerance), and whether to
    tune before running (the CUDA backend's kernel tuner; other backends run the model as it is)."""

    atol: float = 1e-4
    rtol: float = 1e-4
    budget_s: float | None = None  # tune first, once per model, batch shape and GPU, within this many seconds


@dataclass(frozen=True)
class HeadAccess:
    """How a node reads a job's dataset from the head's machine: the head's address and CA, and the job's read
    credential (it reaches that job's dataset files only)."""

    address: str
    ca_pem: bytes  # empty: a head without TLS
    job_id: str
    token: str

    def __repr__(self) -> str:  # never a credential in a log or a traceback
        return f"HeadAccess(address={self.address!r}, job_id={self.job_id!r})"


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
    # The shard's results as an Arrow IPC stream (row_id, passthrough columns, the model's `output`): bytes, so
    # what travels from node to head is Arrow's format, never a pickle of arrays.
    table: bytes
    items: int
    seconds: float  # time spent in the model, loading excluded
    correct: int | None  # predictions equal to the dataset's labels, when it has labels
    node_ray_id: str
    energy: Energy | None  # what the device spent over `seconds`; None where no meter could tell
    peak_memory_bytes: int = 0  # the most memory the shard took on its device (0: not measured)
    log: str = ""  # what the shard printed (stdout and stderr, bounded): farm_agent.capture fills it in


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
    log: str = ""  # what the shard printed (stdout and stderr, bounded): farm_agent.capture fills it in
