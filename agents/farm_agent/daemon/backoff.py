"""How long an agent waits before it tries the head again: exponential backoff with full jitter, capped.

A head that restarts drops every agent's heartbeat stream at the same moment. Agents that all retried every 2 s came
back as a herd, each wave landing on a head still starting up; with full jitter (AWS's "Exponential Backoff And
Jitter": each wait drawn uniformly below base x 2^attempt, at most `cap_s`) their tries spread over a window that
doubles with every failure. Eight lines, so not a dependency (tenacity, backoff) for them.
"""

from __future__ import annotations

import random
from collections.abc import Callable

BASE_S = 1.0  # the first retry comes within a second: a dropped connection to a live head costs little
CAP_S = 30.0  # no wait longer than this: a node silent for longer than offline_after_s comes back within it


class Backoff:
    def __init__(self, base_s: float = BASE_S, cap_s: float = CAP_S,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.uniform = uniform
        self.attempt = 0  # failures since the last success

    def bound(self, attempt: int) -> float:
        """The longest wait after `attempt` + 1 failures in a row."""
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, 64))

    def next_delay(self) -> float:
        """The wait before the next try, after one more failure."""
        delay = self.uniform(0.0, self.bound(self.attempt))
        self.attempt += 1
        return delay

    def reset(self) -> None:
        """The head answered: the next failure starts from the base again."""
        self.attempt = 0
