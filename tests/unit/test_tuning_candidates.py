"""A shard's tuning outcome carries its tuning run's candidates (farm.core.tuning.CandidateFigures): the head checks
them as it checks the rest of a node's word, and `farm job --explain` shows them (farm.head.tuning.describe_outcome)."""

from __future__ import annotations

from farm.core.tuning import CandidateFigures, TuningOutcome
from farm.head.tuning import describe_outcome
from farm.proto.convert import tuning_from_pb, tuning_to_pb

MEASURED = (CandidateFigures("eager", 25.1, 0.91), CandidateFigures("pytorch-defaults", 15.3, 0.52),
            CandidateFigures("channels-last", 12.9, None, ""),
            CandidateFigures("compile-default", note="not measured: the tuning budget ran out"))


def test_the_candidates_travel_to_the_head_and_read_in_the_explain_line() -> None:
    outcome = TuningOutcome(reason="tuned: worth it", tuning_s=21.0, tuning_j=3000.0, candidates=MEASURED)
    assert tuning_from_pb(tuning_to_pb(outcome)) == outcome
    said = describe_outcome(outcome)
    assert said.endswith("its candidates, per call: eager 25.10 ms, 0.91 J; pytorch-defaults 15.30 ms, 0.52 J; "
                         "channels-last 12.90 ms; compile-default not measured: the tuning budget ran out")


def test_the_explain_line_says_what_measuring_each_candidate_took_and_what_the_rest_cost() -> None:
    """An H100's tuned job took 28.6 s for a 20 s budget and measured eager alone: nobody could tell where the time
    went. Each candidate now says what measuring it took, and the line what the run spent outside them."""
    timed = (CandidateFigures("eager", 92.79, 39.6, seconds=5.0), CandidateFigures("channels-last", 80.0, seconds=4.5))
    said = describe_outcome(TuningOutcome(reason="tuned", tuning_s=20.0, tuning_j=5000.0, candidates=timed))
    assert ("the tuning took 20.0 s and 5,000 J above idle, 10.5 s of it outside its candidates (saving and "
            "analysing the model, the idle draw, the evaluator's start); its candidates, per call: eager 92.79 ms, 39.6 J, "
            "5.0 s to measure; channels-last 80.00 ms, 4.5 s to measure") in said
