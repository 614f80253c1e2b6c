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
