"""Which candidate to try first: a contextual bandit (LinUCB) over candidate families, learnt from measured rewards.

Each family (eager, compile-default, tf32, triton-fused, ...) is an arm with two ridge regressions over the model's
feature vector (features.py) that share one design matrix: the reward it earned, log(eager time / its time) when
correct and FAIL_REWARD when it was wrong or did not build, and the log of the seconds its trial took (building,
compiling and measuring), which is what the time budget is spent on. The tuner tries arms in order of their upper
confidence bound on reward, skips those predicted not to fit in what is left of the budget, and stops when no arm
left is plausibly better than the best already measured. Every tuning run's trials update the arms, and the state
persists as JSON, so each run makes the next model's search shorter.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from farm_agent.tuner.features import FEATURE_NAMES

FAIL_REWARD = -1.0  # an incorrect or broken candidate: as bad as one 2.7x slower than eager
RIDGE = 1.0  # the prior's weight: an arm with no data predicts reward 0 (eager's) with unit uncertainty
DEFAULT_ALPHA = 0.5  # how far above its mean an arm's upper bound sits, per unit of uncertainty
STATE_VERSION = 1

# Before an arm has data: seconds a trial is expected to take (torch.compile builds; max-autotune benchmarks GEMM
# configurations). Used only for the budget, until the arm's own cost regression takes over.
PRIOR_TRIAL_S = {"compile-default": 20.0, "compile-max-autotune": 90.0, "compile-reduce-overhead": 25.0,
                 "compile-tf32": 20.0, "compile-autocast-fp16": 25.0, "triton-templates-3xtf32-compile-graph": 25.0}
PRIOR_OTHER_TRIAL_S = 3.0


def default_path() -> Path:
    return Path(os.environ.get("FARM_STATE_DIR", Path.home() / ".farm")) / "tuner" / "policy.json"


@dataclass
class Arm:
    """One family's ridge regressions: A = ridge·I + Σ x xᵀ, b = Σ y x, so θ = A⁻¹ b."""

    a: np.ndarray
    b_reward: np.ndarray
    b_logcost: np.ndarray
    n: int = 0

    @classmethod
    def fresh(cls, dim: int) -> Arm:
        return cls(a=RIDGE * np.eye(dim), b_reward=np.zeros(dim), b_logcost=np.zeros(dim))

    def update(self, x: np.ndarray, reward: float, seconds: float) -> None:
        self.a += np.outer(x, x)
        self.b_reward += reward * x
        self.b_logcost += math.log(max(seconds, 1e-3)) * x
        self.n += 1


@dataclass(frozen=True)
class Estimate:
    name: str
    mean: float  # predicted reward: log speedup over eager
    bonus: float  # alpha · the regression's standard error at this context
    seconds: float  # predicted trial time
    prior: bool = False  # `seconds` is the family's prior (its build), not the arm's own regression

    @property
    def upper(self) -> float:
        return self.mean + self.bonus


@dataclass
class Policy:
    arms: dict[str, Arm] = field(default_factory=dict)
    alpha: float = DEFAULT_ALPHA
    runs: int = 0

    @property
    def dim(self) -> int:
        return len(FEATURE_NAMES)

    def _arm(self, name: str) -> Arm:
        if name not in self.arms:
            self.arms[name] = Arm.fresh(self.dim)
        return self.arms[name]

    def estimate(self, name: str, context: Sequence[float]) -> Estimate:
        x = np.asarray(context, dtype=float)
        arm = self.arms.get(name) or Arm.fresh(self.dim)
        a_inv = np.linalg.inv(arm.a)
        mean = float(a_inv @ arm.b_reward @ x)
        bonus = self.alpha * math.sqrt(max(float(x @ a_inv @ x), 0.0))
        prior_s = PRIOR_TRIAL_S.get(name, PRIOR_OTHER_TRIAL_S)
        # Shrunk toward the prior while the arm has few trials: its regression starts at log(1 s).
        seconds = math.exp(float(a_inv @ arm.b_logcost @ x)) if arm.n >= 3 else prior_s
        return Estimate(name=name, mean=mean, bonus=bonus, seconds=seconds, prior=arm.n < 3)

    def rank(self, context: Sequence[float], names: Sequence[str]) -> list[Estimate]:
        """`names` best first by upper confidence bound; ties (an untrained policy) keep the given order."""
        estimates = [self.estimate(n, context) for n in names]
        order = sorted(range(len(names)), key=lambda i: (-round(estimates[i].upper, 9), i))
        return [estimates[i] for i in order]

    def update(self, context: Sequence[float], name: str, reward: float, seconds: float) -> None:
        self._arm(name).update(np.asarray(context, dtype=float), reward, seconds)

    # --- persistence -----------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION, "features": list(FEATURE_NAMES), "alpha": self.alpha, "runs": self.runs,
            "arms": {name: {"A": arm.a.tolist(), "b_reward": arm.b_reward.tolist(),
                            "b_logcost": arm.b_logcost.tolist(), "n": arm.n} for name, arm in self.arms.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        # A state learnt over other features cannot be read against these: start over rather than misread it.
        if data.get("version") != STATE_VERSION or data.get("features") != list(FEATURE_NAMES):
            return cls()
        arms = {name: Arm(a=np.array(v["A"], dtype=float), b_reward=np.array(v["b_reward"], dtype=float),
                          b_logcost=np.array(v["b_logcost"], dtype=float), n=int(v["n"]))
                for name, v in data.get("arms", {}).items()}
        return cls(arms=arms, alpha=float(data.get("alpha", DEFAULT_ALPHA)), runs=int(data.get("runs", 0)))

    @classmethod
    def load(cls, path: Path | None = None) -> Policy:
        path = path or default_path()
        if not path.exists():
            return cls()
        return cls.from_json(json.loads(path.read_text()))

    def save(self, path: Path | None = None) -> Path:
        path = path or default_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json()))
        os.replace(tmp, path)  # readers never see half a file
        return path


def reward(correct: bool, median_ms: float | None, eager_ms: float | None) -> float:
    """What a trial earned: log speedup over eager when correct, FAIL_REWARD otherwise."""
    if not correct or not median_ms or not eager_ms or median_ms <= 0:
        return FAIL_REWARD
    return math.log(eager_ms / median_ms)


def trials_to_winner(order: Sequence[str], rewards: dict[str, float]) -> int:
    """1-based position in `order` of the arm with the highest measured reward (the winner)."""
    winner = max(rewards, key=lambda n: rewards[n])
    return list(order).index(winner) + 1
