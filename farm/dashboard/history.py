"""The last 15 minutes of every node's utilisation (and Farm's share of it), memory, GPU memory and power, in
memory, for the dashboard's live charts.

All nodes are sampled at once (one tick), so every node's series shares the ticks' time axis, which is the shape a
chart library wants. The figures live in numpy rings rather than per-sample Python objects: 5,000 nodes × 15 minutes
at one tick per 2 s is 18 MB of float32, where tuples of floats would take over 300 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

WINDOW_S = 15 * 60


@dataclass(frozen=True)
class Reading:
    """A node's figures at one tick."""

    name: str
    cpu_percent: float
    power_w: float
    memory_percent: float = math.nan
    farm_cpu_percent: float = math.nan  # Farm's share of cpu_percent; the rest is the owner's
    gpu_memory_percent: float = math.nan  # of the node's GPUs' memory together; NaN: no GPU memory reading


class History:
    def __init__(self, every_s: float, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.capacity = math.ceil(window_s / every_s) + 1
        self._times = np.full(self.capacity, np.nan)
        self._cpu = np.full((self.capacity, 0), np.nan, dtype=np.float32)
        self._power = np.full((self.capacity, 0), np.nan, dtype=np.float32)
        self._memory = np.full((self.capacity, 0), np.nan, dtype=np.float32)
        self._farm = np.full((self.capacity, 0), np.nan, dtype=np.float32)
        self._gpu_memory = np.full((self.capacity, 0), np.nan, dtype=np.float32)
        self._column: dict[str, int] = {}  # node id → its column in the rings
        self._names: dict[str, str] = {}
        self._next = 0  # the slot the next tick goes to

    def add(self, at: float, readings: dict[str, Reading]) -> None:
        """One tick: the readings of the nodes that are live now (the others get a gap)."""
        for node_id, reading in readings.items():
            self._names[node_id] = reading.name
            if node_id not in self._column:
                self._add_column(node_id)
        slot = self._next
        self._times[slot] = at
        self._cpu[slot, :] = np.nan
        self._power[slot, :] = np.nan
        self._memory[slot, :] = np.nan
        self._farm[slot, :] = np.nan
        self._gpu_memory[slot, :] = np.nan
        for node_id, reading in readings.items():
            column = self._column[node_id]
            self._cpu[slot, column] = reading.cpu_percent
            self._power[slot, column] = reading.power_w
            self._memory[slot, column] = reading.memory_percent
            self._farm[slot, column] = min(reading.farm_cpu_percent, reading.cpu_percent)
            self._gpu_memory[slot, column] = reading.gpu_memory_percent
        self._next = (slot + 1) % self.capacity

    def _add_column(self, node_id: str) -> None:
        self._column[node_id] = len(self._column)
        if len(self._column) > self._cpu.shape[1]:  # grow by doubling: a fleet joining node by node copies little
            width = max(8, 2 * self._cpu.shape[1])
            self._cpu = _widen(self._cpu, width)
            self._power = _widen(self._power, width)
            self._memory = _widen(self._memory, width)
            self._farm = _widen(self._farm, width)
            self._gpu_memory = _widen(self._gpu_memory, width)

    def series(self, now: float, limit: int = 24, only: str | None = None) -> dict[str, Any]:
        """The window's ticks, oldest first, and per node its utilisation (the machine's, and split into Farm's
        and the owner's), memory, GPU memory and power (None where it was not live or not read): up to `limit` nodes,
        the busiest over the window first, since a chart of thousands of lines shows nothing. `gpu_memory` is absent
        for a node that reported none in the window (no GPU, or no NVML). `only`: that node's alone (none where it
        was never sampled: a node page's charts)."""
        order = [(self._next + i) % self.capacity for i in range(self.capacity)]
        slots = [s for s in order if not math.isnan(self._times[s]) and self._times[s] >= now - self.window_s]
        cpu = self._cpu[slots, : len(self._column)]
        power = self._power[slots, : len(self._column)]
        memory = self._memory[slots, : len(self._column)]
        farm = self._farm[slots, : len(self._column)]
        owner = np.maximum(cpu - farm, 0)  # NaN where either is
        gpu_memory = self._gpu_memory[slots, : len(self._column)]
        present = ~np.isnan(cpu)
        means = np.where(present, cpu, 0).sum(axis=0) / np.maximum(present.sum(axis=0), 1)
        means[~present.any(axis=0)] = -1.0  # never live in the window: last
        busiest = sorted(self._column, key=lambda n: (-means[self._column[n]], self._names[n]))
        return {
            "window_s": self.window_s,
            "t": [float(self._times[s]) for s in slots],
            "nodes_total": len(self._column),
            "nodes": [
                {"id": n, "name": self._names[n], "cpu": _values(cpu[:, self._column[n]]),
                 "farm_cpu": _values(farm[:, self._column[n]]), "owner_cpu": _values(owner[:, self._column[n]]),
                 "power": _values(power[:, self._column[n]]), "memory": _values(memory[:, self._column[n]]),
                 **({"gpu_memory": _values(gpu_memory[:, self._column[n]])}
                    if not np.isnan(gpu_memory[:, self._column[n]]).all() else {})}
                for n in self._chosen(busiest[:limit], only)
            ],
        }

    def _chosen(self, busiest: list[str], only: str | None) -> list[str]:
        """The nodes charted, by name: `only` (if it was sampled), else the busiest."""
        if only is not None:
            return [only] if only in self._column else []
        return sorted(busiest, key=lambda n: self._names[n])


def _widen(ring: np.ndarray, width: int) -> np.ndarray:
    wider = np.full((ring.shape[0], width), np.nan, dtype=ring.dtype)
    wider[:, : ring.shape[1]] = ring
    return wider


def _values(column: np.ndarray) -> list[float | None]:
    return [None if math.isnan(v) else round(float(v), 2) for v in column]
