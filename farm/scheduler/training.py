"""Training placement: which devices train a job together, and how a global batch is split between them.

Data-parallel training runs one worker per device for the whole job (they step together), so it is chosen once per
start or resume, not shard by shard: the best `count` devices that pass the filters, by the job's policy (items per
joule under efficiency, items per second otherwise; a prior until measured). In `sync` mode every step's global
batch is split in proportion to each worker's measured speed, so that fast and slow devices finish the step
together instead of the fast ones waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from farm.core.models import Node
from farm.scheduler.filters import DEFAULT_FILTERS
from farm.scheduler.scoring import score
from farm.scheduler.types import Assignment, Rate, ShardRequest


class NoWorkers(Exception):
    """No device can train the job now; the message says why each candidate was turned down."""


def choose_workers(request: ShardRequest, nodes: Sequence[Node], count: int,
                   rates: Mapping[tuple[str, str], Rate] | None = None) -> list[Assignment]:
    """Up to `count` devices, best first, one worker each."""
    eligible: list[tuple[float, int, Assignment]] = []
    rejected: list[str] = []
    for node in nodes:
        for offer in node.backends:
            reason = next((r for f in DEFAULT_FILTERS if (r := f(node, offer, request)) is not None), None)
            if reason is not None:
                rejected.append(f"{node.name}/{offer.device}: {reason}")
                continue
            value, basis = score(node, offer, request.policy, rates or {})
            eligible.append((value, len(eligible), Assignment(
                job_id=request.job_id, index=0, node_id=node.id, backend=offer.name, device=offer.device,
                threads=offer.threads, score=value, basis=basis,
            )))
    if not eligible:
        raise NoWorkers("; ".join(rejected) or "no nodes in the fleet")
    eligible.sort(key=lambda e: (-e[0], e[1]))
    return [assignment for _, _, assignment in eligible[:count]]


def batch_shares(global_batch: int, speeds: Sequence[float]) -> list[int]:
    """Split `global_batch` in proportion to `speeds` (items per second), every worker at least one item.

    Largest-remainder rounding, so the shares always sum to the global batch: the gradient that sync mode sums
    over the workers is then exactly the single-worker gradient of that batch.
    """
    if not speeds:
        raise ValueError("no workers")
    if global_batch < len(speeds):
        raise ValueError(f"a global batch of {global_batch} cannot give {len(speeds)} workers an item each")
    spare = global_batch - len(speeds)  # one item each first, the rest by speed
    total = sum(max(s, 0.0) for s in speeds)
    ideal = [spare * max(s, 0.0) / total if total > 0 else spare / len(speeds) for s in speeds]
    shares = [1 + int(x) for x in ideal]
    by_remainder = sorted(range(len(speeds)), key=lambda k: -(ideal[k] - int(ideal[k])))
    for k in by_remainder[: global_batch - sum(shares)]:
        shares[k] += 1
    return shares
