"""A shard's result against the shard it answers: a node (or job code) that says it did 500 items and returns 10 rows
must not pass as done, its short file taken for the job's output."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from farm.core.dataset import ROW_ID
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


def check_table(shard: Shard, items: int, rows: int, ids: pa.ChunkedArray | None, in_bytes: bool) -> None:
    """A results table's `rows` and its row ids (`ids`: its row_id column, None when it has none) against its shard:
    one row per item it claims, every row id inside the range and none twice. `in_bytes`: the range counts bytes of
    lines (a line's id is its offset), not rows."""
    if rows != items:
        raise ShardResultError(f"its result says {items} items and holds {rows} output rows")
    if not in_bytes:
        check(shard, items, rows)
    if rows and ids is None:
        raise ShardResultError(f"its result has no {ROW_ID} column")
    if rows and ids is not None:
        if not pa.types.is_integer(ids.type) or ids.null_count:
            raise ShardResultError(f"its result's {ROW_ID} column is not whole numbers")
        low, high = pc.min_max(ids).values()
        if low.as_py() < shard.start or high.as_py() >= shard.stop or pc.count_distinct(ids).as_py() != len(ids):
            raise ShardResultError(f"its result's row ids are not each once inside its range ({shard.start}-"
                                   f"{shard.stop})")
