"""Does the tuner's policy learn? Trials to the winner on unseen problems, untrained against trained, replayed from
measured results.

    python benchmarks/kernels/policy_learning.py docs/kernels-h200.json [--splits 200] [--out FILE]

Input: a tune_h200.py run made with --exhaustive, so that every candidate of every problem was measured once on the
GPU (time, correctness under strict and loose). Replay: the problems are split at random into two disjoint halves;
a fresh policy is trained on the first half's measured rewards, then, on the second half, the search order (eager
first, then the policy's ranking) of the trained policy is compared with an untrained one's by the position of the
winner (the fastest correct candidate). Averaged over many random splits; under both scorings (strict: fp32
arithmetic only, 1e-4; loose: 1e-2). (Seconds to the winner are not replayed: an exhaustive run measures all of a
problem's candidates in one evaluator call, which reports no per-candidate wall time.)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from farm_agent.tuner.candidates import FAMILIES  # noqa: E402
from farm_agent.tuner.features import ModelFeatures  # noqa: E402
from farm_agent.tuner.policy import Policy, reward  # noqa: E402

FAMILY_ORDER = [f.name for f in FAMILIES]
Problem = tuple[list[float], dict[str, float]]  # context, reward per candidate


def problems_from(report_json: dict[str, Any], scoring: str) -> list[Problem]:
    found = []
    for report in report_json["reports"]:
        features = ModelFeatures.from_json(report["features"])
        if scoring == "strict":  # the context a strict tuning run would have seen
            features = ModelFeatures(**{**features.__dict__, "rtol": 1e-4})
        trials = [t for t in report["trials"] if not (scoring == "strict" and t["lowers_precision"])]
        eager = next((t for t in trials if t["candidate"] == "eager"), None)
        if eager is None or not eager[f"correct_{scoring}"]:
            continue
        rewards = {t["candidate"]: reward(t[f"correct_{scoring}"], t["median_ms"], eager["median_ms"]) for t in trials}
        found.append((features.vector(), rewards))
    return found


def search_order(policy: Policy, context: list[float], names: list[str]) -> list[str]:
    # The candidates in their canonical order (candidates.FAMILIES), which an untrained policy keeps: the recorded
    # order is the order of the run that measured them, whose policy was already learning.
    canonical = sorted(names, key=FAMILY_ORDER.index)
    return ["eager", *(e.name for e in policy.rank(context, [n for n in canonical if n != "eager"]))]


def to_winner(order: list[str], rewards: dict[str, float]) -> int:
    winner = max(order, key=lambda n: rewards[n])  # ties: the earlier in the order
    return order.index(winner) + 1


def replay(problems: list[Problem], splits: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    before_trials: list[int] = []
    after_trials: list[int] = []
    for _ in range(splits):
        shuffled = problems[:]
        rng.shuffle(shuffled)
        half = len(shuffled) // 2
        train, test = shuffled[:half], shuffled[half:]
        trained = Policy()
        for context, rewards in train:
            for name in search_order(trained, context, list(rewards)):
                trained.update(context, name, rewards[name], seconds=1.0)
        for context, rewards in test:
            names = list(rewards)
            before_trials.append(to_winner(search_order(Policy(), context, names), rewards))
            after_trials.append(to_winner(search_order(trained, context, names), rewards))
    return {
        "problems": len(problems), "splits": splits,
        "candidates_per_problem": statistics.mean(len(p[1]) for p in problems),
        "untrained_trials_to_winner": statistics.mean(before_trials),
        "trained_trials_to_winner": statistics.mean(after_trials),
        # eager and the search's first round of three: the winner found in one evaluator call
        "untrained_winner_in_first_round": statistics.mean(t <= 4 for t in before_trials),
        "trained_winner_in_first_round": statistics.mean(t <= 4 for t in after_trials),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="tune_h200.py --exhaustive outputs")
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    data = [json.loads(p.read_text()) for p in args.results]
    figures = {}
    for scoring in ("strict", "loose"):
        problems = [p for d in data for p in problems_from(d, scoring)]
        figures[scoring] = replay(problems, args.splits, args.seed)
        f = figures[scoring]
        print(f"{scoring}: {f['problems']} problems, {f['candidates_per_problem']:.1f} candidates each, "
              f"{f['splits']} random half/half splits; trials to the winner on the unseen half: untrained "
              f"{f['untrained_trials_to_winner']:.2f} -> trained {f['trained_trials_to_winner']:.2f}; "
              f"winner within the first round {f['untrained_winner_in_first_round']:.0%} -> "
              f"{f['trained_winner_in_first_round']:.0%}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
