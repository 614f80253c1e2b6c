"""A node's tuning outcome lists its tuning run's candidates (farm.core.tuning.CandidateFigures), which the head
writes into the job's log: a hostile node's list is refused whole (BadFigures) if it is too long, names what is no
candidate, or carries notes past their bound or figures that are not finite and non-negative."""

from __future__ import annotations

import math

import pytest

from farm.core.tuning import MAX_CANDIDATES, CandidateFigures, TuningOutcome
from farm.proto.convert import BadFigures, tuning_from_pb, tuning_to_pb


@pytest.mark.parametrize("candidates, why", [
    ((CandidateFigures("eager", 1.0),) * (MAX_CANDIDATES + 1), "more than 32 candidates"),
    ((CandidateFigures("eager", math.nan),), "not finite"),
    ((CandidateFigures("eager", 1.0, -5.0),), "negative"),
    ((CandidateFigures("rm -rf /", 1.0),), "is not one"),
    ((CandidateFigures("eager", 1.0, note="x" * 300),), "at most 256 characters"),
])
def test_a_node_s_hostile_candidates_are_refused(candidates: tuple[CandidateFigures, ...], why: str) -> None:
    with pytest.raises(BadFigures, match=why):
        tuning_from_pb(tuning_to_pb(TuningOutcome(candidates=candidates)))
