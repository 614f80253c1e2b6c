"""A shard's task as it travels from the head to a node's worker: JSON, checked against the task's type on arrival.

The head sends each attempt's task over the agent's mutual-TLS work stream (farm.proto.v1 Assignment.task_json), and
a node never sends one back; nothing on this path is pickled. pydantic's TypeAdapter reads the tasks' dataclasses
(and the frozen models inside them) field by field, so a task that is not what its entry point takes is refused
before any of it is used."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from farm.core.errors import AgentError
from farm.core.kernels import KernelEvalTask
from farm.core.tasks import EvaluateTask, ShardTask

# The entry points a node's worker runs (farm_agent's work entry), and the type each one takes.
ENTRY_TASKS: dict[str, type] = {
    "run_shard": ShardTask,
    "run_evaluate_shard": EvaluateTask,
    "run_kernel_shard": KernelEvalTask,
}
MAX_TASK_BYTES = 16 * 1024 * 1024  # a task names its rows and files, never holds them


@cache
def _adapter(entry: str) -> TypeAdapter[Any]:
    return TypeAdapter(ENTRY_TASKS[entry])


def encode_task(entry: str, task: object) -> bytes:
    """The task as JSON (bytes fields base64: a CA's PEM, a kernel's source)."""
    return _adapter(entry).dump_json(task)


def decode_task(entry: str, data: bytes) -> Any:
    """The task an assignment carries, as its entry point's type (AgentError: not one)."""
    if entry not in ENTRY_TASKS:
        raise AgentError(f"unknown entry point {entry[:40]!r}")
    if len(data) > MAX_TASK_BYTES:
        raise AgentError(f"a task of {len(data):,} bytes (at most {MAX_TASK_BYTES:,})")
    try:
        return _adapter(entry).validate_json(data)
    except ValidationError as exc:
        raise AgentError(f"a malformed {entry} task: {exc.errors()[0].get('msg', exc)}") from None
