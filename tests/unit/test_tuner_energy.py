"""farm_agent.tuner.energy over NVML's real counter meter, fed by a simulated board whose counter steps every
100 ms: candidates measured back to back are ranked by joules under `energy` and by time under `time`."""

from __future__ import annotations

from typing import Any

import pytest

from farm.core.tuning import Objective, call_cost, pick
from farm_agent.power.nvml import NvmlCounterMeter
from farm_agent.tuner.energy import measure

IDLE_W = 125.0
STEP_S = 0.1


class Board:
    """An H200's NVML counter as recorded: mJ that step every 100 ms by what the board drew over the step. `draw`
    is the power now; calls advance the clock."""

    NVMLError = RuntimeError

    def __init__(self) -> None:
        self.t, self.mj, self.next_step, self.step_j, self.watts = 0.0, 0, STEP_S, 0.0, IDLE_W

    def run(self, seconds: float, watts: float) -> None:
        while seconds > 0:
            dt = min(seconds, self.next_step - self.t)
            self.step_j += watts * dt
            self.t += dt
            seconds -= dt
            if self.t >= self.next_step - 1e-12:
                self.mj += round(self.step_j * 1e3)
                self.step_j, self.next_step = 0.0, self.next_step + STEP_S

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.run(seconds, IDLE_W)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self.run(30e-6, self.watts)  # a read costs time too
        return self.mj

    def nvmlShutdown(self) -> None: ...


def meter(board: Board) -> NvmlCounterMeter:
    return NvmlCounterMeter(board, "handle", "cuda:0", clock=board.clock, sleep=board.sleep)  # type: ignore[arg-type]


@pytest.mark.parametrize("objective,expected", [(Objective.ENERGY, "cool"), (Objective.TIME, "fast-hot")])
def test_the_recorded_meter_ranks_by_the_objective(objective: Objective, expected: str) -> None:
    board = Board()
    candidates = {"pytorch-defaults": (20.0, 450.0), "fast-hot": (10.0, 680.0), "cool": (14.0, 330.0)}  # ms, W
    costs = {}
    for name, (ms, watts) in candidates.items():
        run = measure(lambda ms=ms, watts=watts: board.run(ms / 1e3, watts), lambda: None, meter(board), ms)
        assert run is not None and run.seconds >= 20 * STEP_S * 0.95  # ~20 of the counter's steps
        costs[name] = call_cost(run.calls, run.seconds, run.joules, IDLE_W)
        assert costs[name].joules == pytest.approx((watts - IDLE_W) * ms / 1e3, rel=0.1)
    assert pick(costs, "pytorch-defaults", objective) == expected
