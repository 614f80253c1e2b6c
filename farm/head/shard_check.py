"""A shard's result against the shard it answers: a node (or job code) that says it did 500 items and returns 10 rows
must not pass as done, its short file taken for the job's output."""

from __future__ import annotations

from farm.core.errors import FarmError
from farm.core.models import Shard


class ShardResultError(FarmError):
    """A result that does not cover its shard's range."""


def check(shard: Shard, items: int, rows: int | None) -> None:
    """`items`: what the result says it did; `rows`: the output rows it carries (None: a kind that writes none)."""
    expected = shard.stop - shard.start
    if items != expected:
        raise ShardResultError(f"its result says {items} items for a range of {expected} ({shard.start}-{shard.stop})")
    if rows is not None and rows != expected:
        raise ShardResultError(f"its result holds {rows} output rows for a range of {expected}")
