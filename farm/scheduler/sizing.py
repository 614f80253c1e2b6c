"""Shards sized by the devices (`shards: auto`): how many rows a device's next shard of a job gets, and from where.

A job with `shards: auto` is not cut up front. Each round, every free device that the job's policy wants gets one
range of rows, sized so that the shard lasts `target_s` on that device:

- long enough for its energy meter: at least METER_STEPS of the meter's steps (NVML's counter steps every 100 ms on
  the H200, so 2 s there; a figure from fewer steps measures the meter, not the work); a model-estimate meter has
  no step;
- long enough for the per-shard overhead (the assignment's trip, the first batch read, the result's trip, the head's
  record) to vanish: the overhead each device shows, measured by the head on its warm worker's shards (before any,
  SHARD_OVERHEAD_S), is at most OVERHEAD_SHARE of a shard;
- starting small while a device is being measured (FIRST_BATCHES batches: its first shard on a model is its
  calibration, with a second of GROWTH-fold that size queued behind it, so the device is not idle while its first
  figures come back) and growing at most GROWTH-fold over the largest shard it has finished, so that one optimistic
  first measurement cannot hand a device a shard it takes minutes over; or, where GROWTH-fold is less, to 1/GROWTH
  of its floor at its measured speed (0.5 s where NVML steps every 100 ms), at most GROWTH x GROWTH-fold (the speed
  is the node's word): a shard measured GROWTH-fold too fast then lasts its floor, and a fast device is not held to
  shards of milliseconds, each with its overhead, while it grows (on an H100 a job's 1,048,576 Parquet rows went in
  six shards, the first three of 16,384 and 65,536 rows lasting 7-158 ms);
- on a figure this job has not confirmed (a prior: other jobs' shards of the same model key on that device), one
  shard of FIRST_BATCHES batches at most, and at most the device's floor at the prior's speed (its meter's steps,
  or ten overheads: 2 s on the H200, 0.4 s on a CPU with the assumed overhead), one at a time, and never part of the
  tail's split: a prior cannot hand one device the job while the others wait, however wrong it is. That shard
  confirms the figure (the next one goes straight to the target: the prior's largest shard counts for the growth)
  or, off by more than 2x, replaces it with the job's own (farm.scheduler.calibration), from which the device grows
  as a new one does;
- near the end, the rest is split so that every device finishes at the same moment (`tail_share`): a device gets
  its share of what is left in proportion to its speed, given when each busy device frees up; a device whose share
  would be shorter than its meter's floor gets nothing (the faster ones finish the rest sooner than it could start
  and end a measurable shard), so no slow device holds up the tail;
- ranges that were cut but never ran (taken back from a lost or drained node) go first, to whichever device frees
  up first, cut again to that device's size: a fast device takes over a slow device's unstarted range.

Sizes are whole batches (a short last batch warms up apart and costs a kernel load of its own), except at the
dataset's end. Pure: no I/O; the head turns each `Cut` into a shard record and launches it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import Field

from farm.core.energy import METER_STEPS
from farm.core.frozen import Frozen
from farm.core.models import BackendName, Node
from farm.core.spec import Policy
from farm.scheduler.filters import DEFAULT_FILTERS
from farm.scheduler.plan import DeviceRate, plan
from farm.scheduler.types import Rate, ShardRequest

# The fixed cost of one shard until a device has shown its own (farm.head.attempts.Overheads): the assignment's trip
# to a warm worker, its model from the worker's cache, the result's trip back, the head's record, the next round.
# Measured with Ray tasks on the local cluster (a head and one agent on this 2-core box) by
# `benchmarks/shard_overhead.py`: 37 ms median over 3 runs of 100 shards (33-44 ms), 2026-12-03; rounded up.
SHARD_OVERHEAD_S = 0.04
# The share of a shard's time the overhead may take: 1 %, so a job of auto shards runs within ~1 % of one long shard.
OVERHEAD_SHARE = 0.01
FIRST_BATCHES = 4  # a device's first shard of a model, while it is measured: a few batches (its warm-up runs apart)
GROWTH = 4  # a device's shard grows at most this-fold over the largest it has finished
# Nominal pieces the remaining rows are cut into to ask the job's policy which devices take part.
PLAN_PIECES = 256


class SizingRules(Frozen):
    """The constants above, as one value: the head uses the defaults, tests and the simulator vary them."""

    meter_steps: int = Field(default=METER_STEPS, ge=1)
    shard_overhead_s: float = Field(default=SHARD_OVERHEAD_S, ge=0)
    overhead_share: float = Field(default=OVERHEAD_SHARE, gt=0, le=1)
    first_batches: int = Field(default=FIRST_BATCHES, ge=1)
    growth: float = Field(default=GROWTH, gt=1)
    overhead_measured: bool = False  # shard_overhead_s is the device's own, as the head measured it

    def for_device(self, overhead_s: float | None) -> SizingRules:
        """These rules with a device's measured per-shard overhead (None: not measured yet: the default's)."""
        if overhead_s is None:
            return self
        return self.model_copy(update={"shard_overhead_s": overhead_s, "overhead_measured": True})

    def target_s(self, meter_step_s: float) -> tuple[float, str]:
        """How long a shard should last on a device whose meter steps every `meter_step_s` (0: no step), and why."""
        meter_s = self.meter_steps * meter_step_s
        overhead_s = self.shard_overhead_s / self.overhead_share
        if meter_s > overhead_s:
            return meter_s, f"{self.meter_steps} steps of its meter's {meter_step_s * 1000:g} ms"
        why = (f"{self.shard_overhead_s * 1000:.0f} ms per-shard overhead "
               f"({'measured on this device' if self.overhead_measured else 'assumed: not measured here yet'}) "
               f"at most {self.overhead_share:.0%} of a shard")
        if meter_step_s > 0:
            why += f"; its meter's {self.meter_steps} steps take {meter_s:g} s"
        return overhead_s, why

    def floor_s(self, meter_step_s: float) -> float:
        """The shortest shard worth running on a device at the tail: its meter's steps, or ten overheads."""
        return max(self.meter_steps * meter_step_s, 10 * self.shard_overhead_s)

    def prior_s(self, meter_step_s: float) -> float:
        """The most a shard may last, at a prior's figure, before the job has confirmed it on the device: its floor
        (its meter's steps, or ten overheads), a few seconds at most; its rows are at most FIRST_BATCHES batches too,
        a bound that a prior's figure, however wrong, cannot raise."""
        return self.floor_s(meter_step_s)


class Range(Frozen):
    """Rows [start, stop) of a job not running anywhere: cut but never run (`index` set), or not cut yet."""

    start: int = Field(ge=0)
    stop: int = Field(ge=0)
    index: int | None = None  # the pending shard that holds it; None: the uncut rest of the dataset

    @property
    def size(self) -> int:
        return self.stop - self.start


class RunningShard(Frozen):
    items: int
    elapsed_s: float = 0.0


class Cut(Frozen):
    """Rows for one device now. `index`: the pending shard whose front this is (its rest stays pending as a new
    shard, `rest`); None: a new shard cut from the dataset's uncut rest."""

    node_id: str
    backend: BackendName
    device: str
    threads: int
    start: int
    stop: int
    index: int | None = None
    rest: tuple[int, int] | None = None  # the part of pending shard `index` left after this cut
    why: str

    @property
    def size(self) -> int:
        return self.stop - self.start


class SizedRound(Frozen):
    cuts: tuple[Cut, ...]
    explanation: tuple[str, ...]  # one line per candidate device: its size and why, or why it waits
    infeasible: str = ""  # every device measured and no plan meets the deadline


def size_for(
    rate: Rate | None, meter_step_s: float, batch_size: int, rules: SizingRules = SizingRules()
) -> tuple[int, str]:
    """A device's next shard away from the tail: rows, and why. `rate`: its measurements on this model (None: never
    run it); its `max_items` is the largest shard it finished, which the next may outgrow only GROWTH-fold."""
    first = rules.first_batches * batch_size
    if rate is None or rate.items_per_s <= 0:
        return first, f"{first:,} rows ({rules.first_batches} batches): its first shard of this model measures it"
    target_s, why = rules.target_s(meter_step_s)
    ideal = _whole_batches(rate.items_per_s * target_s, batch_size)
    if rate.prior:
        capped = _whole_batches(min(first, rate.items_per_s * min(target_s, rules.prior_s(meter_step_s))),
                                batch_size)
        return capped, (f"{capped:,} rows, about {capped / rate.items_per_s:.2g} s at other jobs' "
                        f"{rate.items_per_s:,.0f} rows/s, which this job has not confirmed on this device: this "
                        f"shard confirms it before {ideal:,} rows ({target_s:g} s; target: {why}) are planned on it")
    fold = max(rate.max_items, first) * rules.growth
    quick_s = rules.floor_s(meter_step_s) / rules.growth
    # By time, but never past GROWTH-fold of GROWTH-fold: the speed is the node's word (its shards' seconds), and a
    # node that says its shard took no time must not be handed the job's rows at once.
    quick = min(rate.items_per_s * quick_s, fold * rules.growth)
    grown = _whole_batches(max(fold, quick), batch_size)
    if grown < ideal:
        base, g = max(rate.max_items, first), rules.growth
        how = (f"growing {g:g}x from {base:,}" if quick <= fold else
               f"{quick_s:.2g} s at its speed (1/{g:g} of its floor; {g:g}x from {base:,} is less)"
               if quick < fold * g else
               f"growing {g * g:g}x from {base:,} (1/{g:g} of its floor at its speed is more: its speed is its "
               "node's word)")
        return grown, (f"{grown:,} rows: {how} toward {ideal:,} ({target_s:g} s at {rate.items_per_s:,.0f} rows/s; "
                       f"target: {why})")
    return ideal, f"{ideal:,} rows = {target_s:g} s at {rate.items_per_s:,.0f} rows/s (target: {why})"


def size_behind_first(batch_size: int, rules: SizingRules = SizingRules()) -> tuple[int, str]:
    """A device's second shard, queued while its first one measures it: GROWTH-fold the first, as large as its first
    measurement could make it at the least, so that the device runs it while that measurement comes back (on an H100
    an image job's first shard of 1,024 rows took 0.05 s and its figures reached the head 0.24 s later)."""
    rows = rules.first_batches * batch_size * round(rules.growth)
    return rows, (f"{rows:,} rows ({rules.first_batches * round(rules.growth)} batches): queued behind its first "
                  f"shard, which measures it ({rules.growth:g}x that one)")


def tail_share(rates: Mapping[tuple[str, str], float], busy_s: Mapping[tuple[str, str], float],
               floors: Mapping[tuple[str, str], float], left: float) -> tuple[float, dict[tuple[str, str], float]]:
    """Split `left` rows so that every device finishes at one moment T: device d gets rate_d x (T - busy_d).

    Devices whose part would last less than their floor are dropped, slowest first, and T found again over the rest
    (the faster ones finish sooner without them); the fastest device always stays. Returns T (seconds from now) and
    the rows per device that keeps a part."""
    keys = sorted(rates, key=lambda k: (-rates[k], k))
    while True:
        finish = _water_level(keys, rates, busy_s, left)
        short = [k for k in keys[1:] if finish - busy_s.get(k, 0.0) < floors.get(k, 0.0)]
        if not short:
            return finish, {k: rates[k] * max(0.0, finish - busy_s.get(k, 0.0)) for k in keys}
        keys.remove(min(short, key=lambda k: (rates[k], k)))


def _water_level(keys: Sequence[tuple[str, str]], rates: Mapping[tuple[str, str], float],
                 busy_s: Mapping[tuple[str, str], float], left: float) -> float:
    """The T with sum over devices of rate x max(0, T - busy) = left."""
    order = sorted(keys, key=lambda k: busy_s.get(k, 0.0))
    speed, done_at, level = 0.0, 0.0, 0.0
    for i, key in enumerate(order):
        start = busy_s.get(key, 0.0)
        if speed > 0 and done_at + speed * (start - level) >= left:
            break
        done_at += speed * (start - level)
        level, speed = start, speed + rates[key]
        if i == len(order) - 1:
            break
    return level + (left - done_at) / speed if speed > 0 else math.inf


def size_round(
    job: ShardRequest,
    nodes: Sequence[Node],
    busy: Mapping[tuple[str, str], int],
    running: Mapping[tuple[str, str], Sequence[RunningShard]],
    rates: Mapping[tuple[str, str], Rate],
    pool: Sequence[Range],
    batch_size: int,
    deadline_s: float | None = None,
    rules: SizingRules = SizingRules(),
    units_per_item: float | None = None,
    overheads: Mapping[tuple[str, str], float] | None = None,
) -> SizedRound:
    """One round of an auto-sized job. `job`: what every shard of it asks for (backends, policy, memory; its index
    and items are unused); `busy`: running shards per device over all jobs; `running`: this job's running shards
    per device (`items` in rows); `pool`: the job's units that run nowhere (pending shards, then the uncut rest), in
    order.

    Units are what a shard's range counts: rows (`units_per_item` None), or bytes of line files (JSON Lines, CSV,
    text), whose rows are found only as they are read: `units_per_item` is then the job's bytes per row so far (or
    a guess before its first shard), and sizes worked out in rows are cut in bytes at that ratio."""
    left = sum(r.size for r in pool)
    if left <= 0:
        return SizedRound(cuts=(), explanation=())
    ratio = units_per_item or 1.0

    def units(rows: float) -> int:
        if units_per_item is None:
            return max(batch_size, math.ceil(rows / batch_size) * batch_size)
        return max(1, math.ceil(rows * ratio))

    left_rows = left / ratio
    candidates, rejected = [], []
    for node in nodes:
        for offer in node.backends:
            reason = next((r for f in DEFAULT_FILTERS if (r := f(node, offer, job)) is not None), None)
            if reason is None:
                candidates.append((node, offer))
            else:
                rejected.append(f"{node.name}/{offer.device}: {reason}")
    names = {node.id: node.name for node in nodes}
    measured: list[DeviceRate] = []
    speeds: dict[tuple[str, str], float] = {}
    busy_s: dict[tuple[str, str], float] = {}
    for node, offer in candidates:
        key = (node.id, offer.device)
        rate = rates.get(key)
        if rate is None or rate.items_per_s <= 0:
            continue
        speeds[key] = rate.items_per_s * max(offer.slots, 1)
        busy_s[key] = sum(max(0.0, r.items / rate.items_per_s - r.elapsed_s) for r in running.get(key, ())) / max(
            offer.slots, 1)
        measured.append(DeviceRate(node_id=node.id, device=offer.device, slots=offer.slots,
                                   items_per_s=rate.items_per_s, items_per_j=rate.items_per_j,
                                   energy_source=rate.energy_source, busy_s=busy_s[key]))
    # Which measured devices the policy wants: its plan over the rows left, cut into nominal pieces.
    rows_left = max(1, round(left_rows))
    pieces = min(PLAN_PIECES, rows_left)
    chosen = plan([rows_left // pieces + (i < rows_left % pieces) for i in range(pieces)], measured, job.policy,
                  deadline_s)
    wanted = {key for key, count in chosen.quotas.items() if count}
    infeasible = chosen.why if not chosen.feasible and measured and len(measured) == len(candidates) else ""
    steps = {(node.id, offer.device): offer.meter_step_s for node, offer in candidates}
    overheads = overheads or {}
    floors = {key: rules.for_device(overheads.get(key)).floor_s(steps[key]) for key in wanted}
    lines: list[str] = []
    if measured and chosen.quotas:
        lines.append(f"plan ({job.policy.value}) for {_rows(left_rows, units_per_item)} left: "
                     + ", ".join(f"{names[k[0]]}/{k[1]}" for k in sorted(wanted)))
    # Free devices in the policy's order of preference, so that the best takes the first (oldest) rows.
    order = sorted(candidates, key=lambda c: _preference(rates.get((c[0].id, c[1].device)), job))
    free_pool = list(pool)
    cuts: list[Cut] = []
    for node, offer in order:
        key, label = (node.id, offer.device), f"{node.name}/{offer.device}"
        rate = rates.get(key)
        if left <= 0:
            lines.append(f"{label}: nothing left to cut")
            continue
        if busy.get(key, 0) >= offer.slots:
            lines.append(f"{label}: busy ({busy.get(key, 0)}/{offer.slots} slots)")
            continue
        if rate is not None and rate.items_per_s > 0 and key not in wanted:
            lines.append(f"{label}: not in the plan ({_figures(rate)})")
            continue
        if rate is None and len(running.get(key, ())) > 1:
            lines.append(f"{label}: its first shard is measuring it (its next one is queued)")
            continue
        if rate is not None and rate.prior and running.get(key):
            lines.append(f"{label}: its first shard of this job is confirming other jobs' figure")
            continue
        rows: float  # a tail's share may be a fraction
        if rate is None and running.get(key):
            rows, why = size_behind_first(batch_size, rules)
        else:
            rows, why = size_for(rate, offer.meter_step_s, batch_size, rules.for_device(overheads.get(key)))
        tail = ""  # the tail's reason; its count is the size as cut, known once cut
        if rate is not None and rate.items_per_s > 0 and not rate.prior:  # a prior's shard is short already
            finish, shares = tail_share({k: speeds[k] for k in wanted if not rates[k].prior}, busy_s, floors,
                                        left_rows)
            share = shares.get(key, 0.0)
            if share <= 0:
                lines.append(f"{label}: waits: the last {_rows(left_rows, units_per_item)} finish sooner on faster "
                             f"devices (in {finish:.2f} s)")
                continue
            if share < rows:
                rows = share
                tail = (f"the tail, {_rows(left_rows, units_per_item)} left split by speed so that every device "
                        f"ends together in about {finish:.2f} s")
        size = intended = units(rows)
        if left - size < units(1):  # no sliver of less than a batch (or a row) left behind for a shard of its own
            size = left
        taken = _take(free_pool, min(size, left))
        if taken is None:  # what is left is the rest of a pending shard split this round: it waits for the next
            lines.append(f"{label}: waits for the next round")
            continue
        piece, rest = taken
        got = piece.size
        # The reason states the size as cut (the placement line beside the cut's range reads it): a tail's share, or
        # a size cut short by what was left (the last rows, a pending shard's rest).
        if tail:
            why = f"{_rows(got / ratio, units_per_item)}: {tail}"
        elif got != intended:
            why = f"{got:,} {'bytes' if units_per_item else 'rows'} (what was left); {why}"
        if units_per_item is not None:
            why += f"; {got:,} bytes at {ratio:,.0f} bytes a row"
        cuts.append(Cut(node_id=node.id, backend=offer.name, device=offer.device, threads=offer.threads,
                        start=piece.start, stop=piece.stop, index=piece.index, rest=rest, why=why))
        left -= got
        left_rows = left / ratio
        busy_s[key] = got / ratio / speeds[key] if key in speeds else 0.0
        lines.append(f"{label}: {why}")
    return SizedRound(cuts=tuple(cuts), explanation=tuple(lines + rejected), infeasible=infeasible)


def _take(pool: list[Range], size: int) -> tuple[Range, tuple[int, int] | None] | None:
    """The first `size` rows of the pool, as one range: the front of the first pending shard (its rest stays pending,
    for the next round: it becomes a shard record of its own first), or of the uncut rest. A pending shard smaller
    than `size` is taken whole: a device gets one shard at a time."""
    if not pool or size <= 0:
        return None
    first = pool[0]
    stop = min(first.stop, first.start + size)
    taken = Range(start=first.start, stop=stop, index=first.index)
    if stop < first.stop and first.index is None:
        pool[0] = Range(start=stop, stop=first.stop)
        return taken, None
    pool.pop(0)
    return taken, (stop, first.stop) if stop < first.stop else None


def _whole_batches(rows: float, batch_size: int) -> int:
    return max(batch_size, math.ceil(rows / batch_size) * batch_size)


def _rows(rows: float, units_per_item: float | None) -> str:
    return f"{rows:,.0f} rows" if units_per_item is None else f"~{rows:,.0f} rows"


def _preference(rate: Rate | None, job: ShardRequest) -> tuple[int, float]:
    """Measured devices first (best by the policy's figure), then unmeasured ones."""
    if rate is None or rate.items_per_s <= 0:
        return (1, 0.0)
    if job.policy is not Policy.THROUGHPUT and rate.items_per_j is not None:
        return (0, -rate.items_per_j)
    return (0, -rate.items_per_s)


def _figures(rate: Rate) -> str:
    per_j = f", {rate.items_per_j:,.1f} rows/J ({rate.energy_source})" if rate.items_per_j else ""
    return f"{rate.items_per_s:,.0f} rows/s{per_j}"
