"""Where a shard's time went on its node (farm.core.phases): a node's figures bounded at the head, the shard's log
line, and `farm job --explain`'s line per device."""

from __future__ import annotations

import math
import time
from pathlib import Path

from farm.core.models import Shard
from farm.core.phases import MAX_S, ShardPhases
from farm.head.servicers import job_to_pb
from farm.head.store import Job, Store
from tests.unit.test_store import HW, add_job


def test_a_nodes_figures_are_bounded_and_the_windows_parts_fit_the_window() -> None:
    hostile = {"time_load_s": -3.0, "time_first_batch_s": math.nan, "time_warm_up_s": 1e30,
               "time_input_wait_s": 50.0, "time_output_s": 7.0, "time_tuning_s": math.inf}
    phases = ShardPhases.of(hostile, window=10.0)
    assert phases == ShardPhases(load=0.0, first_batch=0.0, warm_up=MAX_S, input_wait=10.0, output=0.0, tuning=0.0)
    assert ShardPhases.of({"time_input_wait_s": 4.0, "time_output_s": 9.0}, window=10.0) == ShardPhases(
        input_wait=4.0, output=6.0)
    assert ShardPhases.of({"tuning_s": 1.0}, window=10.0) is None  # a kind or a node that reports none


def test_the_shards_log_line_says_what_came_before_its_window_and_what_its_window_waited_on(tmp_path: Path
                                                                                            ) -> None:
    store = Store(tmp_path / "state.db")
    add_job(store)
    phases = ShardPhases(load=0.31, first_batch=0.9, warm_up=1.2, input_wait=0.25, output=0.05)
    store.upsert_node("n-1", "a", HW, [], "", "hash")
    before = time.time()
    store.shard_started("j-1", 0, store.nodes()[0], "cpu", "cpu")
    store.shard_succeeded("j-1", 0, 5, 1.0, None, None, metrics=phases.metrics())
    shard = store.job("j-1").shards[0]
    assert before <= shard.placed_at <= shard.finished_at <= time.time()  # the device's span in explain
    store.shard_succeeded("j-1", 1, 5, 1.0, None, None)  # an older node: no phases, the line as it was
    done = [line["message"] for line in store.logs("j-1") if " done: " in line["message"]]
    assert done == ["shard 0 done: 5 items in 1.000 s; before: loading the model 0.31 s, first batch 0.90 s, "
                    "warm-up 1.20 s; in it: the model 70 %, waiting for input 25 %, sending outputs 5 %",
                    "shard 1 done: 5 items in 1.000 s"]


def test_explain_says_per_device_where_its_shards_time_went() -> None:
    from farm.cli.render import time_by_device

    def shard(i: int, node: str, seconds: float, phases: ShardPhases | None, placed: float = 0.0, ended: float = 0.0
              ) -> Shard:
        return Shard(index=i, start=i, stop=i + 1, node_name=node, device="cuda:0", seconds=seconds,
                     metrics=phases.metrics() if phases else {}, placed_at=placed, finished_at=ended)

    # The gpu's span: 100.0 to 108.0, of which 4.0 s were its windows and 2.4 s before them.
    shards = [shard(0, "gpu", 1.0, ShardPhases(load=0.3, first_batch=0.9, warm_up=1.2, input_wait=0.2), 100.0, 104.0),
              shard(1, "gpu", 3.0, ShardPhases(input_wait=2.6, output=0.12), 103.9, 108.0),
              shard(2, "mac", 2.0, ShardPhases(input_wait=0.1)), shard(3, "old", 2.0, None)]
    record = job_to_pb(Job(id="j", name="n", kind="inference", state="running", spec_yaml="", code_path="",
                           output="", items=4, model_key="", model_bytes=0, error="", explanation="", metrics={},
                           created_at=0.0, started_at=0.0, finished_at=0.0, shards=tuple(shards), correct=None))
    assert [s.HasField("time") for s in record.shards] == [True, True, True, False]
    assert time_by_device(record) == [
        "gpu/cuda:0: 2 shards, 4.000 s measured: the model 27 %, waiting for input 70 %, sending outputs 3 % (bound "
        "by its input (reading and decoding)); before them 2.40 s: loading the model 0.30 s, first batch 0.90 s, "
        "warm-up 1.20 s; of its span of 8.00 s (first placement to last result), 1.60 s in neither (dispatch, "
        "between shards, results)",
        "mac/cuda:0: 1 shard, 2.000 s measured: the model 95 %, waiting for input 5 %, sending outputs 0 % (bound by "
        "the model); before them 0.00 s: nothing"]
