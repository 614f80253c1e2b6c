"""What the scheduler reads and returns."""

from __future__ import annotations

from farm.core.frozen import Frozen
from farm.core.models import BackendName
from farm.core.spec import Policy


class ShardRequest(Frozen):
    job_id: str
    index: int
    items: int
    backends: tuple[BackendName, ...]
    policy: Policy = Policy.EFFICIENCY


class Rate(Frozen):
    """What a (node, backend) has been measured to do; absent until calibration or a finished shard says."""

    items_per_s: float
    items_per_j: float | None = None
    energy_source: str = ""  # where items_per_j's joules came from
    samples: int = 0  # finished shards behind the figures


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
