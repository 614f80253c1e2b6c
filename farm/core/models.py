"""Frozen domain models shared by the head, the scheduler, the agent and the CLI."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from pydantic import Field

from farm.core.energy import DevicePower
from farm.core.frozen import Frozen


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class ShardState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class NodeState(StrEnum):
    JOINING = "joining"  # registered, its Ray worker not yet seen by the head
    READY = "ready"
    DRAINING = "draining"
    OFFLINE = "offline"


class BackendName(StrEnum):
    CUDA = "cuda"
    ANE = "ane"
    MPS = "mps"
    CPU = "cpu"


class Gpu(Frozen):
    index: int
    name: str
    uuid: str = ""
    memory_bytes: int = 0
    driver: str = ""


class Hardware(Frozen):
    hostname: str
    os: str
    arch: str
    cpu_model: str
    cpu_cores: int = Field(ge=1)
    memory_bytes: int = Field(ge=0)
    gpus: tuple[Gpu, ...] = ()
    apple_chip: str = ""


class BackendOffer(Frozen):
    """A backend a node offers (or has detected but cannot run, with the reason)."""

    name: BackendName
    device: str
    detail: str = ""
    slots: int = Field(default=1, ge=0)
    threads: int = Field(default=1, ge=0)
    available: bool = True
    reason: str = ""
    # What the agent found of the device's energy meter: how often its reading moves (0: it has no step, like Farm's
    # model estimate), and the device's draw with no shard running, read on the same meter (None: not measured).
    meter_step_s: float = Field(default=0.0, ge=0)
    idle_w: float | None = Field(default=None, ge=0)
    idle_source: str = ""  # the EnergySource of idle_w: a shard's marginal energy needs the same meter


class GpuMemory(Frozen):
    """A GPU's memory as its node last reported it (NVML)."""

    device: str
    used_bytes: int = Field(ge=0)
    total_bytes: int = Field(ge=0)


class Node(Frozen):
    id: str
    name: str
    state: NodeState
    hardware: Hardware
    backends: tuple[BackendOffer, ...]
    ray_node_id: str = ""
    address: str = ""
    last_heartbeat: float = 0.0
    registered_at: float = 0.0
    cpu_percent: float = 0.0  # the whole machine's
    farm_cpu_percent: float = 0.0  # Farm's own processes' share of cpu_percent; the rest is the owner's
    memory_percent: float = 0.0
    power: tuple[DevicePower, ...] = ()
    gpu_memory: tuple[GpuMemory, ...] = ()
    busy: str = ""  # why the owner needs the node now (its agent's idle policy); empty while it offers work
    drain: bool = False  # an operator drained it (`farm drain`): it takes no new shards until undrained
    trusted: bool = False  # the operator's own machine (joined with the API token): it alone joins the head's Ray


class CpuReading(Protocol):
    """A node's CPU figures as every layer carries them (the store's Node, the wire's fleet_pb2.Node)."""

    cpu_percent: float
    farm_cpu_percent: float


def cpu_split(node: CpuReading) -> tuple[float, float]:
    """The node's CPU use as (the owner's share, Farm's share), each in percent of the whole machine: Farm's is what
    the agent measured of its own processes (itself, its Ray node, the workers running shards), the owner's the rest
    of the machine's. A node busy with its owner's work is not shown as busy with Farm's."""
    farm = min(max(node.farm_cpu_percent, 0.0), node.cpu_percent)
    return max(node.cpu_percent - farm, 0.0), farm


class Shard(Frozen):
    index: int
    start: int
    stop: int
    state: ShardState = ShardState.PENDING
    node_id: str = ""
    node_name: str = ""
    backend: str = ""
    items: int = 0
    seconds: float = 0.0
    error: str = ""
    attempts: int = 0
    energy_j: float = 0.0
    energy_source: str = ""  # an EnergySource value; empty when the shard's energy was not measured
    energy_scope: str = ""
    # The part of energy_j above the device's idle draw read on the same meter (what lending it cost its owner);
    # None where the agent read no idle draw on that meter.
    marginal_j: float | None = None
    device: str = ""
    peak_memory_bytes: int = 0
    metrics: dict[str, float] = {}  # the kind's own figures of the shard (an evaluate shard's loss)
    forward: str = ""  # the tuner's winner the shard ran (farm.core.tuning.TuningOutcome); "" the untuned model
    placed_at: float = 0.0  # when its last attempt was placed on its device (0: never)
    finished_at: float = 0.0  # when its result was recorded (0: not yet)

    @property
    def size(self) -> int:
        return self.stop - self.start
