"""What runs a job's shards on a node, one module per job kind, mirroring farm/head/kinds/. Each sharded kind's
module has `attempt(task, route)`: one attempt in its worker, its result sent to the head by the route's ticket; it
returns the attempt's figures (None: it failed). A kind that reads a dataset may have `read_ahead(task, ticket)`: its
next attempt's first batches read while the one before it runs (farm_agent.work.prefetch.ReadAhead).
Adding a kind: its module here, and a line in ATTEMPTS (farm.core.wire.ENTRY_TASKS names the task's type)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

# The entry point an Assignment names → the module of this package that runs it (imported at its first attempt:
# torch and the tuner load in the worker only).
ATTEMPTS = {"run_shard": "inference", "run_evaluate_shard": "evaluate", "run_kernel_shard": "kernel_eval"}


def _kind(entry: str) -> ModuleType:
    """The module of the kind that runs `entry` (KeyError: no kind does)."""
    return importlib.import_module(f"{__name__}.{ATTEMPTS[entry]}")


def read_ahead(entry: str) -> Callable[[Any, str], None] | None:
    """The `read_ahead(task, ticket)` of the kind that runs `entry`, where it reads its data ahead."""
    return getattr(_kind(entry), "read_ahead", None)


def attempt(entry: str) -> Callable[[Any, Any], Any]:
    """The `attempt` function of the kind that runs `entry`."""
    return _kind(entry).attempt
