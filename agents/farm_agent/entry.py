"""The one door between the head's kinds and the work on a node. A sharded kind's shard is named on the wire by its
entry point (farm.core.wire.ENTRY_TASKS: the task's type) and run by the node's persistent worker through
farm_agent.work.kinds.attempt; training's worker is a Ray actor on trusted nodes, made remote by farm.head.remote,
the head's only import of the agent. Light on purpose: the work's modules (torch through them) load inside the
worker, at the first call.

An attempt sends its result (or its failure) to the head itself, over the head's channel with its upload ticket
(farm_agent.work.upload): the head never reads anything a node made but protobuf, Arrow IPC and safetensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def attempt(entry: str) -> Callable[[Any, Any], Any]:
    """The function that runs one attempt of a shard named by `entry` (KeyError: no such entry point)."""
    from farm_agent.work.kinds import attempt as kind_attempt

    return kind_attempt(entry)


def train_worker() -> type:
    """The training worker's class, a Ray actor on one device (training)."""
    from farm_agent.work.kinds.training import TrainWorker

    return TrainWorker
