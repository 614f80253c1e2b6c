"""What the scheduler reads and returns."""

from __future__ import annotations

from pydantic import Field

from farm.core.frozen import Frozen
from farm.core.models import BackendName
from farm.core.spec import Policy


class ShardRequest(Frozen):
    job_id: str
    index: int
    items: int
    backends: tuple[BackendName, ...]
    policy: Policy = Policy.EFFICIENCY
    # Memory one shard needs: per backend, the most a finished shard of this model took there (measured), and
    # `model_bytes` (its parameters and buffers, from the submitter's preflight) where none has run yet. 0: unknown.
    peak_bytes: dict[BackendName, int] = Field(default_factory=dict)
    model_bytes: int = 0

    def memory_need(self, backend: BackendName) -> int:
        return self.peak_bytes.get(backend, self.model_bytes)


class Rate(Frozen):
    """What a (node, backend) has been measured to do; absent until calibration or a finished shard says."""

    items_per_s: float
    items_per_j: float | None = None
    energy_source: str = ""  # where items_per_j's joules came from
    samples: int = 0  # finished shards behind the figures
    measured_at: float = 0.0  # when the latest of them finished (unix seconds)
    max_items: int = 0  # the largest of them: an auto-sized shard grows from it
    energy_basis: str = ""  # marginal | total: what items_per_j's joules are (an EnergyBasis value)
    # Other jobs' figures only (same model key): the job they are for has not confirmed them on this device yet.
    prior: bool = False


class Assignment(Frozen):
    job_id: str
    index: int
    node_id: str
    backend: BackendName
    device: str
    threads: int
    score: float
    basis: str = ""  # what the score rests on: a measurement (and its energy source) or a prior


class Waiting(Frozen):
    """A shard left unplaced, and why every candidate turned it down."""

    job_id: str
    index: int
    why: str


class Placement(Frozen):
    assignments: tuple[Assignment, ...]
    waiting: tuple[Waiting, ...]
