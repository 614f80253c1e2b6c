"""An agent that lost its head tries again after waits that double up to a cap, each drawn at random below its bound:
agents that lost a restarted head together do not come back together."""

from __future__ import annotations

import random
import statistics

from farm_agent.daemon.backoff import CAP_S, Backoff


def test_the_bounds_double_from_the_base_up_to_the_cap() -> None:
    highest = Backoff(base_s=1.0, cap_s=30.0, uniform=lambda low, high: high)
    assert [highest.next_delay() for _ in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
    lowest = Backoff(uniform=lambda low, high: low)
    assert {lowest.next_delay() for _ in range(8)} == {0.0}  # full jitter: from zero
    assert Backoff().bound(10_000) == CAP_S  # no overflow however long the head stays away


def test_an_answer_starts_the_schedule_again() -> None:
    backoff = Backoff(uniform=lambda low, high: high)
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 1.0


def test_a_herd_that_lost_the_head_together_spreads_out() -> None:
    """1,000 agents lose the head at once: no two seconds of their fifth tries hold more than a fraction of them,
    where a fixed 2 s retry brought all 1,000 back in the same instant."""
    rng = random.Random(7)
    agents = [Backoff(uniform=rng.uniform) for _ in range(1000)]
    fifth = [sum(agent.next_delay() for _ in range(5)) for agent in agents]  # when each agent's fifth try comes
    assert max(fifth) - min(fifth) > 20  # spread over tens of seconds
    busiest = max(sum(1 for t in fifth if start <= t < start + 2) for start in range(0, 31))
    assert busiest < 200
    # and every agent's waits stay under their bounds, on average about half of them
    assert all(t <= 1 + 2 + 4 + 8 + 16 for t in fifth)
    assert 10 < statistics.mean(fifth) < 21
