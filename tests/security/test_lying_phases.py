"""A lender's agent reports where each shard's time went (farm.core.phases). A modified one can send any numbers: a
week of loading, negative waits, more waiting than the window, NaN. The head keeps them within bounds, shows them
within the window, and schedules nothing on them; a figure that is not a number fails the upload in one line."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pyarrow as pa
import pytest

from farm.core.errors import FarmError
from farm.core.phases import MAX_S, ShardPhases
from farm.core.tasks import ShardFigures
from farm.head import arrivals
from farm.head.kinds.inference import Inference
from farm.head.settings import HeadSettings
from tests.security.test_upload_bounds import Counted, staging_for
from tests.uploads import parts

LIES = {"time_load_s": 1e300, "time_first_batch_s": -5.0, "time_warm_up_s": 3.0, "time_input_wait_s": 50.0,
        "time_output_s": 9.0}


def upload(tmp_path: Path, metrics: dict[str, float]) -> arrivals.Arrival:
    rows = pa.table({"row_id": list(range(10))})
    sent = Counted(iter(parts([rows], ShardFigures(items=10, seconds=2.0, metrics=metrics))))
    return asyncio.run(arrivals.receive(sent, staging_for(tmp_path, rows=10), lambda: True))


def test_lying_phases_are_recorded_within_bounds(tmp_path: Path) -> None:
    record = Inference(HeadSettings(state_dir=tmp_path / "state")).measured(upload(tmp_path, LIES))
    phases = ShardPhases.of(record.metrics, record.seconds)
    assert phases == ShardPhases(load=MAX_S, first_batch=0.0, warm_up=3.0, input_wait=2.0, output=0.0)
    assert record.seconds == 2.0 and all(math.isfinite(v) and v >= 0 for v in record.metrics.values())


@pytest.mark.parametrize("lie", [math.nan, math.inf])
def test_a_phase_that_is_not_a_number_fails_the_upload(tmp_path: Path, lie: float) -> None:
    with pytest.raises(FarmError, match="not finite"):
        Inference(HeadSettings(state_dir=tmp_path / "state")).measured(upload(tmp_path, {"time_load_s": lie}))
