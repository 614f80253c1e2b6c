"""Scorers: rank the candidates that passed the filters; higher is better.

Measured rates win over priors. Until a (node, backend) has been measured, a prior stands in for it: a rough
items-per-second by backend kind, scaled by the threads a CPU offers. The prior only has to order devices
sensibly on first contact; the first finished shard replaces it.
"""

from __future__ import annotations

from collections.abc import Mapping

from farm.core.backends import BACKENDS
from farm.core.models import BackendOffer, Node
from farm.core.spec import Policy
from farm.scheduler.plan import POLICIES
from farm.scheduler.types import Rate

def prior_rate(offer: BackendOffer) -> float:
    """The backend's relative speed against one CPU core (farm.core.backends), for models not measured yet."""
    traits = BACKENDS[offer.name]
    return traits.prior_speedup * max(offer.threads, 1) if traits.per_thread else traits.prior_speedup


def score(
    node: Node, offer: BackendOffer, policy: Policy, rates: Mapping[tuple[str, str], Rate]
) -> tuple[float, str]:
    """Items per joule under the efficiency policy when measured, items per second otherwise; and the basis of the
    figure, for explanations."""
    rate = rates.get((node.id, offer.device))
    if rate is None:
        return prior_rate(offer), f"prior {prior_rate(offer):g} (no measurement yet)"
    measured = f"measured over {rate.samples} shards: {rate.items_per_s:,.0f} items/s"
    if rate.items_per_j is not None:
        measured += f", {rate.items_per_j:,.1f} items/J ({rate.energy_source})"
    if POLICIES[policy].scores_energy and rate.items_per_j is not None:
        return rate.items_per_j, measured
    return rate.items_per_s, measured
