"""farm.core.tuning: the cost of a call from a meter's window, the winner under each objective against the
baseline, the break-even arithmetic and the in-job A/B's verdict."""

from __future__ import annotations

from dataclasses import replace

import pytest

from farm.core.tuning import (AB_MIN_ITEMS, TUNING_START_S, AbShard, AbState, CallCost, Objective, ShardRate,
                              TuningOutcome, WinnerKey, ab_min_items, ab_verdict, break_even_rows, call_cost,
                              calls_for_meter, check_outcome, keep_winner, least_tuning_s, objective_for, paid_off_items,
                              pick, plan_tuning)

IDLE_W = 125.0  # an H200 with a CUDA context, idle
LEAST = TUNING_START_S + 3 * (30 * 0.093 + 2.0)  # the least budget for a 93 ms call


def test_the_policy_names_the_objective() -> None:
    assert objective_for("efficiency") is Objective.ENERGY
    assert objective_for("throughput") is Objective.TIME
    assert objective_for("deadline") is Objective.TIME


def test_a_window_spans_twenty_meter_steps() -> None:
    assert calls_for_meter(call_ms=10.0, step_s=0.1) == 200  # 2 s of 10 ms calls
    assert calls_for_meter(call_ms=3000.0, step_s=0.1) == 1
    assert calls_for_meter(call_ms=0.0, step_s=0.1) == 1


def test_a_call_costs_its_share_of_the_energy_above_idle() -> None:
    cost = call_cost(calls=200, seconds=2.0, joules=1360.0, idle_w=IDLE_W)  # 680 W over 2 s
    assert cost.ms == pytest.approx(10.0)
    assert cost.joules == pytest.approx((1360.0 - 250.0) / 200)
    # Barely above idle: floored at 5 % of the draw, as a shard's marginal energy is, never free.
    assert call_cost(10, 1.0, 126.0, IDLE_W).joules == pytest.approx(0.05 * 126.0 / 10)
    assert call_cost(10, 1.0, None, IDLE_W).joules is None


def recorded() -> dict[str, CallCost]:
    # Windows of 2 s each (the counter's 20 steps) on an H200: the fastest candidate draws the most power.
    return {
        "pytorch-defaults": call_cost(100, 2.0, 900.0, IDLE_W),  # 20 ms, 6.5 J above idle per call
        "triton-templates-3xtf32": call_cost(200, 2.0, 1360.0, IDLE_W),  # 10 ms, 5.55 J
        "channels-last": call_cost(140, 2.0, 660.0, IDLE_W),  # 14.3 ms, 2.93 J
    }


def test_energy_and_time_pick_different_winners_when_they_disagree() -> None:
    costs = recorded()
    assert pick(costs, "pytorch-defaults", Objective.ENERGY) == "channels-last"
    assert pick(costs, "pytorch-defaults", Objective.TIME) == "triton-templates-3xtf32"


def test_a_winner_must_beat_the_baseline_by_the_margin() -> None:
    costs = {"eager": CallCost(10.0, 5.0), "cuda-graph": CallCost(9.7, 4.9)}  # 3 % and 2 %: noise
    assert pick(costs, "eager", Objective.TIME) == "eager"
    assert pick(costs, "eager", Objective.ENERGY) == "eager"
    costs["cuda-graph"] = CallCost(9.0, 4.0)
    assert pick(costs, "eager", Objective.ENERGY) == "cuda-graph"


def test_without_a_counter_energy_ranks_by_time() -> None:
    costs = {"eager": CallCost(10.0), "compile-default": CallCost(5.0)}
    assert pick(costs, "eager", Objective.ENERGY) == "compile-default"


def test_tuning_runs_only_where_the_rows_left_can_pay_for_it() -> None:
    # 1M rows at 1 ms each: 15 % of 1000 s is 150 s of saving, more than the 120 s asked.
    plan = plan_tuning(budget_s=120, rows_left=1_000_000, baseline_per_row=1e-3, tuning_per_s=1.0,
                       objective=Objective.TIME, least_s=LEAST)
    assert plan.tune and plan.budget_s == 120
    # 400k rows: 60 s of saving caps the budget at 60 s.
    plan = plan_tuning(budget_s=120, rows_left=400_000, baseline_per_row=1e-3, tuning_per_s=1.0,
                       objective=Objective.TIME, least_s=LEAST)
    assert plan.tune and plan.budget_s == pytest.approx(60.0) and "capped" in plan.reason
    # An H100's tuned job: 737,280 rows at 5,431 rows/s could save ~20 s, and its tuning run capped at 20 s spent
    # 28.6 s measuring the reference alone. Below the least that measures a candidate of the model (a 93 ms call:
    # LEAST) no run is made, whatever the budget asked.
    plan = plan_tuning(budget_s=60, rows_left=737_280, baseline_per_row=1 / 5431, tuning_per_s=1.0,
                       objective=Objective.TIME, least_s=LEAST)
    assert not plan.tune and "not worth it" in plan.reason
    plan = plan_tuning(budget_s=20, rows_left=10**9, baseline_per_row=1e-3, tuning_per_s=1.0,
                       objective=Objective.TIME, least_s=LEAST)
    assert not plan.tune and "a budget of 20 s measures no candidate (the least that does for this model is 26 s)" in plan.reason
    # 20k rows could save 3 s: less than one round of tuning costs.
    plan = plan_tuning(budget_s=120, rows_left=20_000, baseline_per_row=1e-3, tuning_per_s=1.0,
                       objective=Objective.TIME, least_s=LEAST)
    assert not plan.tune and plan.budget_s == 0 and "not worth it" in plan.reason
    # Joules: 5 J per row over 1M rows, 15 % of it, at 400 W above idle while tuning: 1875 s worth; budget kept.
    plan = plan_tuning(budget_s=120, rows_left=1_000_000, baseline_per_row=5.0, tuning_per_s=400.0,
                       objective=Objective.ENERGY, least_s=LEAST)
    assert plan.tune and plan.budget_s == 120 and " J " in plan.reason


def test_the_least_budget_follows_the_model_s_call() -> None:
    """A fixed 45 s floor kept a job of a fast model from tuning that a 25 s run would have paid for, and let a slow
    model's run start that could not measure one candidate. The least budget is a run's start and three
    measurements (eager, the untuned baseline, one candidate) of the model's own call."""
    assert least_tuning_s(0.001) == pytest.approx(TUNING_START_S + 3 * (0.03 + 2.0))
    assert least_tuning_s(0.093) == pytest.approx(LEAST)
    assert least_tuning_s(4.0) == pytest.approx(TUNING_START_S + 3 * (30 * 4.0 + 4.0))  # a call past the meter's window
    fast = plan_tuning(budget_s=30, rows_left=2_000_000, baseline_per_row=1e-3, tuning_per_s=1.0,
                       objective=Objective.TIME, least_s=least_tuning_s(0.005))
    slow = plan_tuning(budget_s=30, rows_left=2_000_000, baseline_per_row=1e-3, tuning_per_s=1.0,
                       objective=Objective.TIME, least_s=least_tuning_s(0.5))
    assert fast.tune and fast.budget_s == 30
    assert not slow.tune and "a budget of 30 s measures no candidate" in slow.reason


def test_a_cached_winner_costs_nothing() -> None:
    plan = plan_tuning(budget_s=120, rows_left=10**9, baseline_per_row=1.0, tuning_per_s=1.0,
                       objective=Objective.TIME, least_s=LEAST, cached=True)
    assert not plan.tune and plan.budget_s == 0 and "cached" in plan.reason


def test_break_even_rows() -> None:
    assert break_even_rows(tuning_cost=60.0, baseline_per_row=2e-3, winner_per_row=1e-3) == pytest.approx(60_000)
    assert break_even_rows(60.0, 1e-3, 1e-3) is None


def test_the_in_job_ab_goes_back_to_eager_when_the_winner_loses() -> None:
    eager = ShardRate(rows=10_000, seconds=1.0, joules=300.0)
    faster_hotter = ShardRate(rows=10_000, seconds=0.8, joules=380.0)
    assert keep_winner(eager, faster_hotter, Objective.TIME)
    assert not keep_winner(eager, faster_hotter, Objective.ENERGY)
    slower = ShardRate(rows=10_000, seconds=1.2, joules=200.0)
    assert not keep_winner(eager, slower, Objective.ENERGY)
    better = ShardRate(rows=10_000, seconds=0.7, joules=250.0)
    assert keep_winner(eager, better, Objective.ENERGY)
    no_counter = ShardRate(rows=10_000, seconds=0.7, joules=None)
    assert keep_winner(ShardRate(10_000, 1.0, None), no_counter, Objective.ENERGY)


def _rate(rows: int, seconds: float, joules: float | None) -> ShardRate:
    return ShardRate(rows=rows, seconds=seconds, joules=joules)


def test_the_ab_waits_until_both_sides_have_enough_items() -> None:
    eager = AbShard("", _rate(500, 0.5, 150.0))
    assert ab_verdict([], Objective.ENERGY, 1000).state is AbState.EAGER_FIRST
    assert not ab_verdict([eager], Objective.ENERGY, 1000).runs_winner  # eager first, until it holds 1000 items
    two = ab_verdict([eager, eager], Objective.ENERGY, 1000)
    assert two.state is AbState.TRYING and two.runs_winner
    tried = ab_verdict([eager, eager, AbShard("cuda-graphs", _rate(500, 0.1, 10.0))], Objective.ENERGY, 1000)
    assert tried.state is AbState.TRYING  # one winner shard: too few items to judge, however good


def test_the_ab_reverts_to_eager_when_the_winner_loses_and_stays_reverted() -> None:
    eager = AbShard("", _rate(1000, 1.0, 300.0))
    slower = AbShard("cuda-graphs", _rate(1000, 1.2, 250.0))
    verdict = ab_verdict([eager, slower], Objective.ENERGY, 1000)
    assert verdict.state is AbState.REVERTED and not verdict.runs_winner and verdict.winner == "cuda-graphs"
    hotter = AbShard("cuda-graphs", _rate(1000, 0.8, 380.0))  # faster, but more joules per item: loses on energy
    assert ab_verdict([eager, hotter], Objective.ENERGY, 1000).state is AbState.REVERTED
    assert ab_verdict([eager, hotter], Objective.TIME, 1000).state is AbState.KEPT
    # Later shards (eager after the revert, however slow) do not reopen a settled verdict.
    later = [eager, slower, AbShard("", _rate(5000, 50.0, 9000.0))]
    assert ab_verdict(later, Objective.ENERGY, 1000).state is AbState.REVERTED


def test_the_ab_keeps_a_winner_that_wins_and_says_by_how_much() -> None:
    verdict = ab_verdict([AbShard("", _rate(1000, 1.0, 300.0)), AbShard("w", _rate(1000, 0.5, 200.0))],
                         Objective.ENERGY, 1000)
    assert verdict.state is AbState.KEPT and verdict.runs_winner
    assert verdict.gain(Objective.TIME) == pytest.approx(2.0)
    assert verdict.gain(Objective.ENERGY) == pytest.approx(1.5)
    # 0.3 J/item against 0.2: 9 kJ of tuning pay back after 90,000 items; by time, 30 s after 60,000.
    assert paid_off_items(verdict, 30.0, 9000.0, Objective.ENERGY) == pytest.approx(90_000)
    assert paid_off_items(verdict, 30.0, 9000.0, Objective.TIME) == pytest.approx(60_000)
    assert paid_off_items(verdict, 30.0, None, Objective.ENERGY) == pytest.approx(60_000)  # no counter: seconds


def test_ab_min_items() -> None:
    assert ab_min_items(1_000_000) == AB_MIN_ITEMS
    assert ab_min_items(8000) == 800
    assert ab_min_items(3) == 1


def _key(**changes: object) -> WinnerKey:
    parts: dict[str, object] = dict(device_name="NVIDIA H200", driver="570.1", torch_version="2.9.0", model_key="m1",
                                    input_shapes=("float32[512, 3, 64, 64]",), atol=1e-4, rtol=1e-4,
                                    objective=Objective.ENERGY)
    return WinnerKey(**{**parts, **changes})  # type: ignore[arg-type]


def test_the_winner_key_has_every_part() -> None:
    key = _key()
    assert key.digest() == _key().digest()
    for part, other in (("device_name", "NVIDIA A100"), ("driver", "560.0"), ("torch_version", "2.8.0"),
                        ("model_key", "m2"), ("input_shapes", ("float32[256, 3, 64, 64]",)), ("atol", 1e-3),
                        ("rtol", 1e-2), ("objective", Objective.TIME)):
        assert _key(**{part: other}).digest() != key.digest(), part
    assert key.fits("NVIDIA H200", "570.1", "2.9.0", ["float32[512, 3, 64, 64]"])
    assert not key.fits("NVIDIA H200", "570.1", "2.9.0", ["float32[7, 3, 64, 64]"])
    assert not key.fits("NVIDIA A100", "570.1", "2.9.0", ["float32[512, 3, 64, 64]"])


def test_a_nodes_outcome_is_checked() -> None:
    good = TuningOutcome(winner="cuda-graphs", params=(("mode", "static"), ("warmup", 3)), reason="tuned: ...",
                         tuning_s=12.0, tuning_j=3000.0, device_name="NVIDIA H200", driver="570.1",
                         torch_version="2.9.0", input_shapes=("float32[512, 8]",))
    assert check_outcome(good) is good
    for bad in (replace(good, winner="__import__('os')"), replace(good, params=(("Bad Name", 1),)),
                replace(good, params=(("x", float("nan")),)), replace(good, tuning_s=-1.0),
                replace(good, reason="x" * 10_000), replace(good, params=tuple((f"p{i}", i) for i in range(40)))):
        with pytest.raises(ValueError):
            check_outcome(bad)
