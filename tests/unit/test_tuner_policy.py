"""The tuner's policy learns: trained on one set of (synthetic) problems, it finds the winner of a second, disjoint
set in fewer trials than an untrained policy; and its state survives a save and a load."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from farm_agent.tuner.features import FEATURE_NAMES
from farm_agent.tuner.policy import FAIL_REWARD, Policy, default_path, reward, trials_to_winner

ARMS = ["eager", "compile-default", "compile-max-autotune", "cuda-graph", "channels-last", "tf32", "autocast-fp16",
        "triton-fused"]
DIM = len(FEATURE_NAMES)


def synthetic_problems(rng: np.random.Generator, count: int) -> list[tuple[np.ndarray, dict[str, float]]]:
    """Problems of three kinds (conv-heavy, matmul-heavy, elementwise-heavy, told apart by their op-mix features),
    where a different arm wins each kind; rewards are a hidden linear function of the features plus noise, and some
    arms fail on some problems."""
    truth = {arm: rng.normal(0.0, 0.15, DIM) for arm in ARMS}
    truth["channels-last"][2] += 1.5  # share_conv: channels_last wins convolutions
    truth["autocast-fp16"][1] += 1.2  # share_matmul: half precision wins GEMMs
    truth["triton-fused"][5] += 1.0  # share_elementwise: fused kernels win elementwise chains
    problems = []
    for _ in range(count):
        kind = rng.integers(3)
        shares = rng.dirichlet([1, 1, 1, 1, 1]) * 0.3
        shares[[2, 1, 4][kind]] += 0.7
        x = np.concatenate([[1.0], shares, rng.uniform(0.2, 1.0, DIM - 6)])
        rewards = {arm: float(truth[arm] @ x + rng.normal(0, 0.05)) for arm in ARMS}
        rewards["eager"] = 0.0
        for arm in rng.choice(ARMS[1:], size=1):
            if rng.random() < 0.3 and rewards[str(arm)] < max(rewards.values()):
                rewards[str(arm)] = FAIL_REWARD
        problems.append((x, rewards))
    return problems


def search_order(policy: Policy, x: np.ndarray) -> list[str]:
    # As the tuner does: eager first (the reference), the policy orders the rest.
    return ["eager", *(e.name for e in policy.rank(x, ARMS[1:]))]


def mean_trials(policy: Policy, problems: list[tuple[np.ndarray, dict[str, float]]]) -> float:
    return float(np.mean([trials_to_winner(search_order(policy, x), r) for x, r in problems]))


def test_a_trained_policy_finds_winners_on_unseen_problems_in_fewer_trials() -> None:
    rng = np.random.default_rng(7)
    problems = synthetic_problems(rng, 120)
    train, test = problems[:60], problems[60:]
    untrained = Policy()
    trained = Policy()
    for x, rewards in train:  # every arm measured once per training problem, as a full tuning run would
        for arm in search_order(trained, x):
            trained.update(x, arm, rewards[arm], seconds=1.0)

    before, after = mean_trials(untrained, test), mean_trials(trained, test)
    assert after < 3.0 and before - after > 3.0, (before, after)


def test_untrained_policy_keeps_the_given_order() -> None:
    x = np.ones(DIM)
    assert [e.name for e in Policy().rank(x, ARMS)] == ARMS


def test_a_failing_arm_sinks_and_a_winning_one_rises() -> None:
    policy = Policy()
    x = np.linspace(0.1, 1.0, DIM)
    for _ in range(5):
        policy.update(x, "compile-default", FAIL_REWARD, seconds=20.0)
        policy.update(x, "tf32", math.log(3.0), seconds=2.0)
    ranked = [e.name for e in policy.rank(x, ["compile-default", "eager", "tf32"])]
    assert ranked == ["tf32", "eager", "compile-default"]
    assert 10.0 < policy.estimate("compile-default", x).seconds < 40.0  # its cost regression took over


def test_state_round_trips_through_json(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FARM_STATE_DIR", str(tmp_path))
    policy = Policy()
    x = np.linspace(0.0, 1.0, DIM)
    policy.update(x, "tf32", 0.7, seconds=3.0)
    policy.runs = 1
    path = policy.save()
    assert path == default_path() == tmp_path / "tuner" / "policy.json"
    loaded = Policy.load()
    assert loaded.runs == 1 and loaded.estimate("tf32", x) == policy.estimate("tf32", x)


def test_reward_is_log_speedup_when_correct() -> None:
    assert reward(True, 2.0, 4.0) == math.log(2.0)
    assert reward(False, 1.0, 4.0) == FAIL_REWARD
    assert reward(True, None, 4.0) == FAIL_REWARD


def measured_times(times: dict[str, float], calls: list[list[str]]):  # type: ignore[no-untyped-def]
    """An evaluator round over recorded times (the search's logic alone; the real evaluator runs in the e2e test)."""
    from farm_agent.tuner.evaluator import Result

    def result(name: str) -> Result:
        return Result(problem="p", candidate=name, compiled=True, correct=True, max_abs_err=0.0, rel_norm_err=0.0,
                      max_scaled_err=0.0, median_ms=times[name], runs=20, error="", sound=True,
                      excess=((0.0, 0.0),))

    def measure(cands):  # type: ignore[no-untyped-def]
        calls.append([c.name for c in cands])
        return [result("eager"), *(result(c.name) for c in cands)], 2.0 * (len(cands) + 1)

    return measure


NAMES = ["eager", "compile-default", "compile-reduce-overhead", "cuda-graph", "tf32", "autocast-fp16",
         "compile-autocast-fp16"]
TIMES = {"eager": 10.0, "compile-default": 9.0, "compile-reduce-overhead": 9.0, "cuda-graph": 10.0, "tf32": 3.0,
         "autocast-fp16": 1.0, "compile-autocast-fp16": 1.2}


def test_a_trained_search_stops_after_the_round_that_found_the_winner() -> None:
    from farm_agent.tuner.tune import search

    x = np.linspace(0.1, 1.0, DIM)
    trained = Policy()
    for _ in range(10):
        for name, ms in TIMES.items():
            trained.update(x, name, math.log(TIMES["eager"] / ms), seconds=2.0)
    calls: list[list[str]] = []
    order, _, skipped, reason = search(NAMES, x, trained, 600.0, measured_times(TIMES, calls))
    assert order[:2] == ["eager", "autocast-fp16"]
    assert len(calls) == 1 and "compile-default" in calls[0]  # one round, the baseline riding along
    assert reason == "no candidate left is plausibly 5% faster" and skipped

    untrained_calls: list[list[str]] = []
    search(NAMES, x, Policy(), 600.0, measured_times(TIMES, untrained_calls))
    assert len(untrained_calls) == 2  # the given order reaches autocast-fp16 only in the second round


def test_the_budget_leaves_only_the_baselines() -> None:
    from farm_agent.tuner.tune import search

    calls: list[list[str]] = []
    _, measured, skipped, reason = search(NAMES, np.ones(DIM), Policy(), 0.0, measured_times(TIMES, calls))
    assert calls == [["compile-default"]] and reason == "budget"
    assert [(m.name, m.searched) for m in measured] == [("eager", True), ("compile-default", False)]
    assert set(skipped) == set(NAMES) - {"eager", "compile-default"}


def test_the_jobs_own_baseline_is_measured_right_after_eager_and_compile_default_last() -> None:
    """A tuning budget can stop a round part way: the job's untuned baseline goes first, or a winner found before the
    budget ran out would have no yardstick."""
    from farm_agent.tuner.tune import search

    names = [*(n for n in NAMES if n != "compile-default"), "pytorch-defaults", "compile-default"]
    calls: list[list[str]] = []
    search(names, np.ones(DIM), Policy(), 600.0, measured_times({**TIMES, "pytorch-defaults": 10.0}, calls),
           always=("pytorch-defaults", "eager", "compile-default"))
    # An untrained policy keeps the given order: the round's three candidates between the two baselines.
    assert calls[0] == ["pytorch-defaults", "compile-reduce-overhead", "cuda-graph", "tf32", "compile-default"]


def test_no_round_starts_past_the_deadline() -> None:
    """A job's 20 s tuning budget took 28.6 s on an H100: a second round began after the deadline (its start, the
    model's save and analysis, were spent from the budget too) and measured eager again. The search's rounds stop
    at the run's deadline, whatever the budget's own arithmetic says is left."""
    import time

    from farm_agent.tuner.tune import search

    calls: list[list[str]] = []
    measure = measured_times(TIMES, calls)

    def late(cands):  # type: ignore[no-untyped-def]
        results = measure(cands)
        time.sleep(0.2)  # the first round ends past the deadline
        return results[0], 0.0  # and claims it took no time: only the deadline can stop the next

    _, measured, skipped, reason = search(NAMES, np.ones(DIM), Policy(), 600.0, late, round_size=1,
                                          deadline=time.monotonic() + 0.1)
    assert len(calls) == 1 and reason == "budget"
    assert {m.name for m in measured} == {"eager", *calls[0]}
    assert set(skipped) == set(NAMES) - {"eager", *calls[0]}


def test_an_untried_family_is_expected_to_cost_its_build_and_what_measuring_eager_did() -> None:
    """A family's prior seconds are its build (3 s for most): measuring a 93 ms call (30 calls and a 2 s energy run)
    costs more than that on its own. Once eager's measurement has taken its seconds, an untried family is expected to
    take those too, and one that cannot finish in what is left is not started (its time would be cut, and spent)."""
    from dataclasses import replace

    from farm_agent.tuner.tune import search

    calls: list[list[str]] = []
    measure = measured_times(TIMES, calls)

    def slow_eager(cands):  # type: ignore[no-untyped-def]
        results, _ = measure(cands)
        timed = [replace(r, seconds=30.0 if r.candidate == "eager" else 1.0) for r in results]
        return timed, sum(r.seconds for r in timed)

    _, measured, skipped, reason = search(NAMES, np.ones(DIM), Policy(), 40.0, slow_eager, round_size=1, always=())
    assert len(calls) == 1 and reason == "budget"  # 40 - 31 s left: no untried family fits in 9 s
    assert len(measured) == 2 and set(skipped) == set(NAMES) - {"eager", *calls[0]}
