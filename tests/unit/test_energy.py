from __future__ import annotations

import pytest

from farm.core.energy import Energy, EnergyScope, EnergySource, marginal_joules


def window(joules: float, seconds: float, source: EnergySource = EnergySource.COUNTER) -> Energy:
    return Energy(joules=joules, seconds=seconds, source=source, scope=EnergyScope.DEVICE)


def test_marginal_energy_is_the_window_less_the_idle_draw_over_it() -> None:
    # 3 s at 680 W on an H200 that idles at 125 W: 2,040 J read, 1,665 J of it added by the shard.
    assert marginal_joules(window(2040.0, 3.0), 125.0, "counter") == pytest.approx(1665.0)


def test_marginal_energy_needs_the_idle_draw_from_the_same_meter() -> None:
    assert marginal_joules(window(2040.0, 3.0), 125.0, "vendor-estimate") is None
    assert marginal_joules(window(2040.0, 3.0), None, "") is None
    # Farm's CPU model bills no idle: measured 0 W on it, marginal equals total.
    estimate = window(12.0, 2.0, EnergySource.MODEL_ESTIMATE)
    assert marginal_joules(estimate, 0.0, "model-estimate") == pytest.approx(12.0)


def test_marginal_energy_within_the_meters_error_of_nothing_is_floored() -> None:
    assert marginal_joules(window(380.0, 3.0), 130.0, "counter") == pytest.approx(0.05 * 380.0)
