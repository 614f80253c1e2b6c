"""Calibration: what each (node, device) has been measured to do on a model, from its finished shards.

Every finished shard is a measurement, so the figures refine themselves as a fleet works. Only the latest RECENT
shards of a device count: a device whose speed changed (a driver update, a measurement taken under someone else's
load) converges to what it does now. Energy per item is only given where every sample carries energy from one
source: a rate mixing a counter with an estimate would rank unlike against like.

Figures from other jobs of the same model (same code, environment and inputs: farm.head.kinds.base.model_key) are a
prior for a job: they stand until the job's own shards on that device say otherwise. Where the job's own shards
there contradict them by more than OVERRULE-fold (in speed, or in items per joule on one kind of meter), the prior
is dropped and the device's figures are the job's own alone; a rate that holds none of the job's own shards is
marked `prior`, and sizing plans only a short shard on it (farm.scheduler.sizing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from farm.core.energy import METER_STEPS, EnergyBasis
from farm.core.frozen import Frozen
from farm.scheduler.types import Rate

# Shards per device behind a rate: enough to average out one slow shard, few enough to follow a change.
RECENT = 8
# How far a job's own figures on a device may stray from the prior before they replace it: the spread of one device's
# warm shards is well inside 2x (a cold first shard is kept out of the meter's window), so more is another workload.
OVERRULE = 2.0


class Sample(Frozen):
    node_id: str
    device: str
    items: int
    seconds: float
    energy_j: float = 0.0
    energy_source: str = ""  # empty: not measured
    marginal_j: float | None = None  # above the device's idle draw; None where no idle draw was read on its meter
    finished_at: float = 0.0  # unix seconds
    job_id: str = ""  # the job whose shard this was ("": not said)


def rates(samples: Iterable[Sample], meter_steps: Mapping[tuple[str, str], float] | None = None,
          basis: EnergyBasis = EnergyBasis.MARGINAL, job_id: str | None = None) -> dict[tuple[str, str], Rate]:
    """Per (node, device): its speed over its latest shards, and its items per joule over those of them that lasted
    METER_STEPS of the device's meter (`meter_steps`: seconds per step), where any did: the short first shards of an
    auto-sized job measure speed well and energy badly (a meter's step is billed whole).

    `basis` marginal: items per joule above the idle draw, where every such shard has that figure; a device without
    one ranks by its total, an upper bound of its marginal energy (so it is never favoured for lacking a reading).

    `job_id`: the job the figures are for. Its own shards overrule the other jobs' (the prior) on a device where they
    contradict them by more than OVERRULE-fold; a device with none of its own is given as `prior`. None: every
    sample counts alike, none is a prior."""
    grouped: defaultdict[tuple[str, str], list[Sample]] = defaultdict(list)
    for sample in samples:
        grouped[(sample.node_id, sample.device)].append(sample)
    found = {}
    for key, group in grouped.items():
        floor_s = METER_STEPS * (meter_steps or {}).get(key, 0.0)
        own = [s for s in group if job_id is not None and s.job_id == job_id]
        if own and len(own) < len(group) and _contradicts(_figures(own, floor_s, basis),
                                                          _figures([s for s in group if s.job_id != job_id],
                                                                   floor_s, basis)):
            group = own
        group = sorted(group, key=lambda s: s.finished_at)[-RECENT:]
        rate = _figures(group, floor_s, basis)
        if rate is not None:
            prior = job_id is not None and not any(s.job_id == job_id for s in group)
            found[key] = rate.model_copy(update={"prior": prior}) if prior else rate
    return found


def _figures(group: list[Sample], floor_s: float, basis: EnergyBasis) -> Rate | None:
    """One device's figures over `group` (its latest shards), None where they add up to no work."""
    group = sorted(group, key=lambda s: s.finished_at)[-RECENT:]
    items = sum(s.items for s in group)
    seconds = sum(s.seconds for s in group)
    if items <= 0 or seconds <= 0:
        return None
    metered = [s for s in group if s.seconds >= floor_s] or group
    sources = {s.energy_source for s in metered}
    marginal = basis is EnergyBasis.MARGINAL and all(s.marginal_j is not None for s in metered)
    joules = sum((s.marginal_j or 0.0) if marginal else s.energy_j for s in metered)
    measured = len(sources) == 1 and "" not in sources and joules > 0
    return Rate(
        items_per_s=items / seconds,
        items_per_j=sum(s.items for s in metered) / joules if measured else None,
        energy_source=sources.pop() if measured else "",
        samples=len(group),
        measured_at=max(s.finished_at for s in group),
        max_items=max(s.items for s in group),
        energy_basis=(EnergyBasis.MARGINAL if marginal else EnergyBasis.TOTAL).value if measured else "",
    )


def _contradicts(own: Rate | None, prior: Rate | None) -> bool:
    """The job's own figures and the prior's differ by more than OVERRULE-fold: in speed, or in items per joule
    where both read one kind of meter on one basis."""
    if own is None or prior is None:
        return False
    pairs = [(own.items_per_s, prior.items_per_s)]
    if (own.items_per_j and prior.items_per_j and own.energy_source == prior.energy_source
            and own.energy_basis == prior.energy_basis):
        pairs.append((own.items_per_j, prior.items_per_j))
    return any(max(a, b) > OVERRULE * min(a, b) for a, b in pairs)
