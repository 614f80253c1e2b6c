"""Whether a node's Ray worker backs what the node claimed at Register. The scheduler places a shard by the node's
claimed offers, and Ray runs it only where the node's Ray worker offers the matching resource (`farm.<backend>`, one
per slot): a node claiming a device its Ray worker does not offer (a `cuda:0` it does not have) would hold a shard
that Ray can never schedule, "running" for ever. Such a node is never made ready."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from farm.core.models import BackendOffer


def unbacked(offers: Iterable[BackendOffer], ray_resources: Mapping[str, float]) -> list[str]:
    """The backends whose claimed slots the Ray worker does not offer, as `name (N claimed, Ray offers M)`."""
    claimed: dict[str, int] = {}
    for offer in offers:
        if offer.available and offer.slots:
            claimed[offer.name.value] = claimed.get(offer.name.value, 0) + offer.slots
    return [f"{name} ({slots} claimed, Ray offers {ray_resources.get(f'farm.{name}', 0):g})"
            for name, slots in sorted(claimed.items()) if ray_resources.get(f"farm.{name}", 0) < slots]
