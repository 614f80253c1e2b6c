"""The region kinds the matcher rewrites: one module each, holding its TemplateRegion and its anchor finder
(`find(matcher, node, mod) -> Anchor | None`). Adding a kind is a new module and a line in FINDERS.

A node is offered to each finder in FINDERS' order and the first anchor found is its region's. The finders claim
disjoint nodes but the row ops' finder, the most general (any row op, and the elementwise nodes before it), is last.
What no anchored region took, pointwise.fuse (not a finder) takes last: the elementwise graphs left."""

from __future__ import annotations

from farm_agent.tuner.templates.regions import (attention, conv, cross_entropy, distance, gather, gemm, pool,
                                                recurrence, rows, scan)
from farm_agent.tuner.templates.regions.base import Finder

FINDERS: tuple[Finder, ...] = (
    conv.find,
    gemm.find,  # nn.Linear, then matmul / bmm / mm
    distance.find,
    attention.find,
    cross_entropy.find,
    gather.find,
    pool.find,
    scan.find,
    recurrence.find,  # nn.GRU, nn.LSTM
    rows.find,  # last: it reads any op on a tensor's rows (and the elementwise nodes before it)
)
