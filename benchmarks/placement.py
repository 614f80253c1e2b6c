"""How long the scheduler takes to place shards over a large fleet (pure code, no I/O).

    python benchmarks/placement.py [--shards 10000] [--nodes 1000] [--repeat 5]

Target (issue 11): placing 10,000 shards over 1,000 nodes in under 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from farm.core.models import BackendName, BackendOffer, Hardware, Node, NodeState
from farm.core.spec import Policy
from farm.scheduler import Rate, ShardRequest, place
from farm.scheduler.rounds import schedule_round

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=16, memory_bytes=2**36)


def fleet(count: int) -> list[Node]:
    """A mixed fleet: every node a CPU (4 slots); every fourth a GPU box, every fifth a Mac."""
    nodes = []
    for i in range(count):
        offers = [BackendOffer(name=BackendName.CPU, device="cpu", threads=16, slots=4)]
        if i % 4 == 0:
            offers.append(BackendOffer(name=BackendName.CUDA, device="cuda:0", slots=2))
        if i % 5 == 0:
            offers.append(BackendOffer(name=BackendName.ANE, device="ane", slots=1))
        nodes.append(Node(id=f"n-{i:05d}", name=f"node-{i}", state=NodeState.READY, hardware=HW,
                          backends=tuple(offers)))
    return nodes


def measured(nodes: list[Node]) -> dict[tuple[str, str], Rate]:
    per_kind = {"cpu": (500.0, 20.0), "cuda:0": (20000.0, 60.0), "ane": (3000.0, 300.0)}
    return {(n.id, o.device): Rate(items_per_s=per_kind[o.device][0] * (1 + (i % 7) / 100),
                                   items_per_j=per_kind[o.device][1], energy_source="counter", samples=3)
            for i, n in enumerate(nodes) for o in n.backends}


def timed(call: Callable[[], object], repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        runs.append(time.perf_counter() - began)
    return statistics.median(runs), max(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    nodes = fleet(args.nodes)
    rates = measured(nodes)
    shards = [ShardRequest(job_id="j-bench", index=i, items=100, backends=tuple(BackendName))
              for i in range(args.shards)]
    slots = sum(o.slots for n in nodes for o in n.backends)
    table = Table(title=f"Placing {args.shards:,} shards over {args.nodes:,} nodes ({slots:,} slots)")
    for column in ("step", "median s", "max s", "placed now", "target"):
        table.add_column(column)
    cases: list[tuple[str, Callable[[], object]]] = [
        ("place: fill free slots by score", lambda: place(shards, nodes, rates=rates)),
        *[(f"round: plan ({p.value}) + place",
           lambda p=p: schedule_round([s.model_copy(update={"policy": p}) for s in shards], nodes, {}, {}, rates,
                                      deadline_s=60.0 if p is Policy.DEADLINE else None))
          for p in Policy],
    ]
    for name, call in cases:
        median, worst = timed(call, args.repeat)
        result = call()
        placed = len(result.assignments)  # type: ignore[attr-defined]
        table.add_row(name, f"{median:.3f}", f"{worst:.3f}", f"{placed:,}", "< 1 s" + (" ✓" if median < 1 else " ✗"))
    Console().print(table)


if __name__ == "__main__":
    main()
