"""Kernel-eval jobs' pure part: pairs from a job's file names, shards over them, rewards; and the spec section."""

from __future__ import annotations

import pytest

from farm.core.errors import SpecError
from farm.core.kernels import KernelPair, RewardMode, kernel_pairs, kernel_shard_ranges, reward
from farm.core.spec import parse_spec

NAMES = ["k/problems/relu.py", "k/problems/gelu.py", "k/problems/_helpers.py", "k/cands/relu/a.py",
         "k/cands/relu/b.py", "k/cands/relu/_util.py", "k/cands/gelu/x.py", "k/cands/readme.md"]


def test_candidates_pair_with_the_problem_of_their_folder_sorted_helpers_apart() -> None:
    pairs = kernel_pairs(NAMES, "k/problems", "./k/cands/")
    assert [(p.stem, p.name) for p in pairs] == [("gelu", "x"), ("relu", "a"), ("relu", "b")]
    assert pairs[0] == KernelPair("k/problems/gelu.py", "k/cands/gelu/x.py")


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["k/cands/relu/a.py"], "no problem files"),
        (["k/problems/relu.py", "k/cands/relu.py"], "no candidates"),
        (["k/problems/relu.py", "k/cands/relu/a.py", "k/cands/selu/a.py"], "folder 'selu' matches no problem"),
    ],
)
def test_a_set_without_pairs_or_with_orphan_candidates_is_refused(names: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        kernel_pairs(names, "k/problems", "k/cands")


def test_a_shard_holds_one_problems_candidates_at_most_per_shard() -> None:
    pairs = [KernelPair("p/a.py", f"c/a/{i}.py") for i in range(5)] + [KernelPair("p/b.py", "c/b/0.py")]
    assert kernel_shard_ranges(pairs, 16) == [(0, 5), (5, 6)]
    assert kernel_shard_ranges(pairs, 2) == [(0, 2), (2, 4), (4, 5), (5, 6)]


@pytest.mark.parametrize(
    ("correct", "vs_eager", "vs_compile", "milestone"),
    [(False, None, None, -1.0), (True, 1.0, 0.5, 1.0), (True, 1.04, 2.0, 1.0), (True, 1.06, 1.0, 2.0),
     (True, 1.06, 1.06, 3.0), (True, 1.2, None, 2.0)],
)
def test_rewards(correct: bool, vs_eager: float | None, vs_compile: float | None, milestone: float) -> None:
    assert reward(RewardMode.MILESTONES, correct, vs_eager, vs_compile) == milestone
    assert reward(RewardMode.SPEEDUP, correct, vs_eager, vs_compile) == (vs_eager if correct else 0.0)


def test_the_kernel_eval_section_goes_with_its_kind_only() -> None:
    spec = parse_spec("name: k\nkind: kernel-eval\nkernel_eval: {problems: p, candidates: c}\n")
    assert spec.kernel_eval is not None and spec.kernel_eval.reward is RewardMode.SPEEDUP and not hasattr(spec, "model")
    assert [b.value for b in spec.kernel_eval_backends] == ["cuda", "cpu"]
    with pytest.raises(SpecError, match="does not go with kind 'inference'"):
        parse_spec("name: k\nmodel: m:b\ndataset: d.npy\nkernel_eval: {problems: p, candidates: c}\n")
    with pytest.raises(SpecError, match="runs on cuda or cpu"):
        parse_spec("name: k\nkind: kernel-eval\nbackends: [mps]\nkernel_eval: {problems: p, candidates: c}\n")
