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
    ((CandidateFigures("eager", 1.0, seconds=math.inf),), "not finite"),
    ((CandidateFigures("eager", 1.0, seconds=-1.0),), "negative"),
])
def test_a_node_s_hostile_candidates_are_refused(candidates: tuple[CandidateFigures, ...], why: str) -> None:
    with pytest.raises(BadFigures, match=why):
        tuning_from_pb(tuning_to_pb(TuningOutcome(candidates=candidates)))


def test_a_candidate_s_seconds_travel_and_read_back() -> None:
    sent = TuningOutcome(candidates=(CandidateFigures("eager", 92.8, 39.6, seconds=5.25), CandidateFigures("tf32")))
    got = tuning_from_pb(tuning_to_pb(sent))
    assert got.candidates == sent.candidates
    assert got.candidates[0].describe() == "eager 92.80 ms, 39.6 J, 5.2 s to measure"
