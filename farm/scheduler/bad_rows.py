"""A shard that fails on its data: cut down to the range that does not read, so that its other rows still run; and
the job's error budget (the spec's max_bad_rows and max_failed_fraction), which says whether the rows skipped so let
the job succeed. Pure.

Ranges are [start, stop) in the dataset plan's units (row ids; bytes of line files, whose readers name no range, so
that a shard over them fails whole).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Range = tuple[int, int]


@dataclass(frozen=True)
class Cut:
    """What becomes of a shard that failed on its data: it keeps `bad` (failed, skipped) and `rest`, its rows on
    either side, become new shards that run again."""

    bad: Range
    rest: tuple[Range, ...]


def cut(shard: Range, bad: Range | None) -> Cut:
    """The shard cut around `bad`, the range its reader said does not read. A range unsaid, empty or not inside the
    shard (a node's word is checked, never trusted) fails the shard whole."""
    start, stop = shard
    if bad is None or not start <= bad[0] < bad[1] <= stop:
        return Cut(bad=shard, rest=())
    return Cut(bad=bad, rest=tuple((a, b) for a, b in ((start, bad[0]), (bad[1], stop)) if a < b))


def allowed(items: int, max_bad_rows: int, max_failed_fraction: float) -> int:
    """How many of a job's `items` may be skipped: the larger of its two budgets."""
    return max(max_bad_rows, math.floor(max_failed_fraction * items))


def over_budget(skipped: Sequence[Range], items: int, max_bad_rows: int, max_failed_fraction: float) -> str | None:
    """Why the skipped ranges fail the job (None: they are within its budget)."""
    rows = sum(b - a for a, b in skipped)
    budget = allowed(items, max_bad_rows, max_failed_fraction)
    if rows <= budget:
        return None
    return (f"{plural(rows, 'row')} of {items} do not read ({plural(len(skipped), 'range')}), over the job's error "
            f"budget of {budget} (max_bad_rows, max_failed_fraction)")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
