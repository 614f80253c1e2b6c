"""Auto-sized shards (farm/scheduler/sizing.py) on the recorded node fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.core.models import BackendName, BackendOffer, Hardware, Node, NodeState
from farm.core.spec import Policy
from farm.scheduler.calibration import Sample, rates
from farm.scheduler.sizing import Range, RunningShard, SizingRules, size_for, size_round, tail_share
from farm.scheduler.types import Rate, ShardRequest

NODES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
NVML_STEP_S = 0.1  # the H200's counter (DESIGN.md)
RULES = SizingRules(shard_overhead_s=0.03, overhead_share=0.01)  # a 3 s target where the meter asks less


def node(node_id: str, fixture: str, *offers: BackendOffer) -> Node:
    hardware = Hardware.model_validate_json((NODES / f"{fixture}.json").read_text())
    return Node(id=node_id, name=node_id, state=NodeState.READY, hardware=hardware, backends=offers)


def cpu(threads: int) -> BackendOffer:
    return BackendOffer(name=BackendName.CPU, device="cpu", threads=threads)


GPU = BackendOffer(name=BackendName.CUDA, device="cuda:0", meter_step_s=NVML_STEP_S)
FLEET = [node("h200", "h200-box", cpu(16), GPU), node("laptop", "laptop-cpu", cpu(8))]


def job(policy: Policy = Policy.THROUGHPUT) -> ShardRequest:
    return ShardRequest(job_id="j", index=0, items=0, backends=tuple(BackendName), policy=policy)


def rate(per_s: float, per_j: float | None = None, max_items: int = 10**9) -> Rate:
    return Rate(items_per_s=per_s, items_per_j=per_j, energy_source="counter" if per_j else "", samples=8,
                max_items=max_items)


MEASURED = {("h200", "cuda:0"): rate(18_000, 120.0), ("h200", "cpu"): rate(600, 4.0), ("laptop", "cpu"): rate(300, 5.0)}


def uncut(start: int, stop: int) -> list[Range]:
    return [Range(start=start, stop=stop)]


def test_the_target_is_the_longer_of_the_meters_steps_and_the_overhead_budget() -> None:
    assert RULES.target_s(0.0)[0] == pytest.approx(3.0)  # a model estimate: no step, the overhead decides
    assert RULES.target_s(NVML_STEP_S)[0] == pytest.approx(3.0)  # 20 x 100 ms = 2 s < 3 s
    slow_meter, why = RULES.target_s(0.5)  # a meter stepping every 500 ms: 20 steps = 10 s
    assert slow_meter == pytest.approx(10.0) and "20 steps" in why
    assert RULES.floor_s(NVML_STEP_S) == pytest.approx(2.0)


def test_a_device_being_measured_gets_one_shard_queued_behind_its_first() -> None:
    """On an H100 an image job's first shard of 1,024 rows took 0.05 s and its figures reached the head 0.24 s later:
    the device sat idle meanwhile. A second shard of GROWTH-fold the first (what the first's measurement would give it
    at the least) queues behind it; a third waits for the measurement."""
    gpu_only = ShardRequest(job_id="j", index=0, items=0, backends=(BackendName.CUDA,))
    first = size_round(gpu_only, FLEET, {}, {}, {}, uncut(0, 10**6), 64, rules=RULES)
    assert [c.size for c in first.cuts] == [256]
    behind = size_round(gpu_only, FLEET, {}, {("h200", "cuda:0"): [RunningShard(items=256)]}, {},
                        uncut(256, 10**6), 64, rules=RULES)
    assert [(c.start, c.size) for c in behind.cuts] == [(256, 1024)]
    assert behind.cuts[0].why == "1,024 rows (16 batches): queued behind its first shard, which measures it (4x that one)"
    third = size_round(gpu_only, FLEET, {}, {("h200", "cuda:0"): [RunningShard(items=256), RunningShard(items=1024)]},
                       {}, uncut(1280, 10**6), 64, rules=RULES)
    assert third.cuts == () and "h200/cuda:0: its first shard is measuring it (its next one is queued)" in \
        third.explanation
    small = size_round(gpu_only, FLEET, {}, {("h200", "cuda:0"): [RunningShard(items=256)]}, {}, uncut(256, 1000), 64,
                       rules=RULES)
    assert [(c.start, c.stop) for c in small.cuts] == [(256, 1000)]  # no more than is left


def test_a_device_starts_small_and_grows_toward_its_target() -> None:
    first, why = size_for(None, NVML_STEP_S, 64, RULES)
    assert first == 4 * 64 and "measures it" in why
    sizes = [first]
    for _ in range(6):
        size, why = size_for(rate(18_000, max_items=sizes[-1]), NVML_STEP_S, 64, RULES)
        sizes.append(size)
    # 1/4 of its floor (2 s: 20 NVML steps) at 18,000 rows/s where 4x is less, at most 16x, then 4x, then 18,000
    # rows/s x 3 s, in whole batches.
    assert sizes[:4] == [256, 4096, 16384, 54016]
    assert sizes[-1] == 54016 and "3 s at 18,000 rows/s" in why
    quick = size_for(rate(18_000, max_items=1024), NVML_STEP_S, 64, RULES)[1]
    assert quick.startswith("9,024 rows: 0.5 s at its speed (1/4 of its floor; 4x from 1,024 is less)")
    slow = size_for(rate(1_000, max_items=256), NVML_STEP_S, 64, RULES)  # 0.5 s is 500 rows: 4x decides
    assert slow[0] == 1024 and slow[1].startswith("1,024 rows: growing 4x from 256")


def test_a_fast_device_does_not_crawl_up_from_its_first_shard_4x_at_a_time() -> None:
    """On an H100 a job's 1,048,576 Parquet rows went in six shards (16,384, 65,536 x2, 262,144 x2, the tail), a
    first shard of 7 ms growing 4x at a time, each shard with its overhead: its second shard now lasts 1/4 of the
    device's floor at its measured speed, at most 16x its first."""
    sizes = [size_for(None, NVML_STEP_S, 4096, RULES)[0]]
    while sum(sizes) < 1_048_576:
        sizes.append(min(size_for(rate(2_500_000, max_items=max(sizes)), NVML_STEP_S, 4096, RULES)[0],
                         1_048_576 - sum(sizes)))
    assert sizes == [16_384, 262_144, 770_048]  # 1/4 of its floor is 1.25 M rows: 16x decides


def test_each_device_gets_its_own_size_from_the_front_of_the_rows() -> None:
    decided = size_round(job(), FLEET, busy={}, running={}, rates=MEASURED, pool=uncut(0, 10**7), batch_size=64,
                         rules=RULES)
    sizes = {(c.node_id, c.device): c.size for c in decided.cuts}
    assert sizes == {("h200", "cuda:0"): 54016, ("h200", "cpu"): 1856, ("laptop", "cpu"): 960}
    assert [c.start for c in decided.cuts] == [0, 54016, 54016 + 1856]  # the fastest takes the first rows
    assert all(c.index is None for c in decided.cuts)  # all new, cut from the uncut rest
    assert any(line.startswith("h200/cuda:0: 54,016 rows = 3 s") for line in decided.explanation)


def test_near_the_end_the_rest_is_split_so_that_every_device_ends_together() -> None:
    # The GPU is busy for another 0.5 s; 24,000 rows are left and both CPUs are free.
    running = {("h200", "cuda:0"): [RunningShard(items=18_000, elapsed_s=0.5)]}
    decided = size_round(job(), FLEET, busy={("h200", "cuda:0"): 1}, running=running, rates=MEASURED,
                         pool=uncut(976_000, 1_000_000), batch_size=64, rules=RULES)
    sizes = {c.node_id: c.size for c in decided.cuts}
    # T with 18,000 (T - 0.5) + 600 T + 300 T = 24,000 is 1.746 s: the h200's CPU gets ~1,048 rows, the laptop ~524
    # (1.7 s each, over their floor of ten overheads, 0.3 s), in whole batches.
    finish, shares = tail_share({("g",): 18_000, ("c",): 600, ("l",): 300}, {("g",): 0.5}, {}, 24_000)  # type: ignore[dict-item]
    assert finish == pytest.approx((24_000 + 9_000) / 18_900)
    assert sizes["h200"] == pytest.approx(shares[("c",)], abs=64) and sizes["laptop"] == pytest.approx(shares[("l",)], abs=64)
    assert all(c.why.startswith(f"{c.size:,} rows: the tail") for c in decided.cuts)  # the size as cut


def test_a_slow_device_sits_out_a_tail_too_short_for_its_meter() -> None:
    # 3,000 rows left, the GPU free in 0.05 s: it ends them in 0.22 s; a CPU's share would last under its floor.
    running = {("h200", "cuda:0"): [RunningShard(items=18_000, elapsed_s=0.95)]}
    decided = size_round(job(), FLEET, busy={("h200", "cuda:0"): 1}, running=running, rates=MEASURED,
                         pool=uncut(997_000, 1_000_000), batch_size=64, rules=RULES)
    assert decided.cuts == ()
    assert any(line.startswith("laptop/cpu: waits: the last 3,000 rows finish sooner on faster devices (in 0.22 s)")
               for line in decided.explanation)
    alone = size_round(job(), FLEET, busy={}, running={}, rates=MEASURED, pool=uncut(997_000, 1_000_000),
                       batch_size=64, rules=RULES)
    assert [(c.node_id, c.device, c.size) for c in alone.cuts] == [("h200", "cuda:0", 3000)]
    assert "laptop/cpu: nothing left to cut" in alone.explanation


def test_tail_share_drops_the_slowest_first_and_keeps_the_fastest() -> None:
    speeds = {("fast", "d"): 1000.0, ("slow", "d"): 10.0}
    finish, shares = tail_share(speeds, {}, {("fast", "d"): 2.0, ("slow", "d"): 2.0}, 500)
    assert set(shares) == {("fast", "d")} and finish == pytest.approx(0.5)  # the fastest stays even under its floor
    finish, shares = tail_share(speeds, {("fast", "d"): 10.0}, {("slow", "d"): 2.0}, 500)
    assert finish == pytest.approx(10_500 / 1010) and shares[("slow", "d")] == pytest.approx(10.0 * finish)


def test_unstarted_ranges_go_first_and_are_cut_to_the_taker() -> None:
    # Shard 3 ([0, 200,000)) was taken back from a lost node: the GPU takes its front, its rest stays pending.
    pool = [Range(start=0, stop=200_000, index=3), *uncut(400_000, 1_000_000)]
    decided = size_round(job(), FLEET, busy={}, running={}, rates=MEASURED, pool=pool, batch_size=64, rules=RULES)
    gpu = next(c for c in decided.cuts if c.device == "cuda:0")
    assert (gpu.index, gpu.start, gpu.stop, gpu.rest) == (3, 0, 54016, (54016, 200_000))
    others = [c for c in decided.cuts if c.device == "cpu"]
    assert all(c.index is None and c.start >= 400_000 for c in others)  # the rest of 3 waits for the next round


def test_unmeasured_devices_calibrate_while_the_measured_ones_work() -> None:
    measured = {("h200", "cuda:0"): MEASURED[("h200", "cuda:0")]}
    decided = size_round(job(), FLEET, busy={}, running={}, rates=measured, pool=uncut(0, 10**6), batch_size=32,
                         rules=RULES)
    sizes = {(c.node_id, c.device): c.size for c in decided.cuts}
    assert sizes[("h200", "cpu")] == sizes[("laptop", "cpu")] == 128  # 4 batches of 32
    assert sizes[("h200", "cuda:0")] == 54016
    again = size_round(job(), FLEET, busy={("laptop", "cpu"): 1}, running={("laptop", "cpu"): [RunningShard(items=128)]},
                       rates=measured, pool=uncut(60_000, 10**6), batch_size=32, rules=RULES)
    assert "laptop/cpu: busy (1/1 slots)" in again.explanation


def test_the_efficiency_policy_sizes_only_the_devices_it_plans_for() -> None:
    decided = size_round(job(Policy.EFFICIENCY), FLEET, busy={}, running={}, rates=MEASURED, pool=uncut(0, 10**7),
                         batch_size=64, rules=RULES)
    assert [(c.node_id, c.device) for c in decided.cuts] == [("h200", "cuda:0")]
    assert any(line.startswith("laptop/cpu: not in the plan") for line in decided.explanation)


def test_nothing_left_nothing_cut_and_filtered_devices_say_why() -> None:
    assert size_round(job(), FLEET, {}, {}, MEASURED, [], 64).cuts == ()
    gpu_only = ShardRequest(job_id="j", index=0, items=0, backends=(BackendName.CUDA,))
    decided = size_round(gpu_only, FLEET, {}, {}, MEASURED, uncut(0, 100), 64, rules=RULES)
    assert [c.size for c in decided.cuts] == [100]  # the end of the dataset: what is left, not a whole batch
    assert "laptop/cpu: cpu not allowed by the job" in decided.explanation


def test_energy_figures_come_from_shards_long_enough_for_the_meter() -> None:
    # A 14 ms first shard billed a whole 100 ms step (14 J); the long shards that followed read the work.
    samples = [Sample(node_id="h", device="cuda:0", items=256, seconds=0.014, energy_j=14.0, energy_source="counter"),
               Sample(node_id="h", device="cuda:0", items=54_000, seconds=3.0, energy_j=450.0, energy_source="counter")]
    found = rates(samples, meter_steps={("h", "cuda:0"): NVML_STEP_S})[("h", "cuda:0")]
    assert found.items_per_j == pytest.approx(54_000 / 450.0)
    assert found.items_per_s == pytest.approx(54_256 / 3.014) and found.max_items == 54_000
    assert rates(samples[:1], meter_steps={("h", "cuda:0"): NVML_STEP_S})[("h", "cuda:0")].items_per_j == (
        pytest.approx(256 / 14.0))  # only short ones: the best there is


def test_line_files_are_cut_in_bytes_at_the_jobs_bytes_per_row() -> None:
    # A JSON Lines dataset: ranges count bytes; 50 bytes a row so far. The laptop is new: 4 batches' worth of bytes.
    measured = {k: v for k, v in MEASURED.items() if k[0] == "h200"}
    decided = size_round(job(), FLEET, busy={}, running={}, rates=measured, pool=uncut(0, 10**9), batch_size=64,
                         rules=RULES, units_per_item=50.0)
    sizes = {(c.node_id, c.device): c.size for c in decided.cuts}
    assert sizes == {("h200", "cuda:0"): 54_016 * 50, ("h200", "cpu"): 1_856 * 50, ("laptop", "cpu"): 4 * 64 * 50}
    assert any(line.endswith("2,700,800 bytes at 50 bytes a row") for line in decided.explanation)


def simulate(speeds: dict[tuple[str, str], float], rows: int, batch_size: int = 64) -> tuple[float, dict, list]:
    """Rounds of size_round over FLEET as a head would run them, each device running at its true speed and measured
    by its finished shards: (makespan, each device's finish, the cuts in order)."""
    import heapq

    now, cut_to, finished_rows = 0.0, 0, 0
    running: dict[tuple[str, str], tuple[float, int]] = {}  # device -> (ends at, rows)
    done: dict[tuple[str, str], list[int]] = {}
    events: list[tuple[float, tuple[str, str]]] = []
    cuts, ends = [], {}
    while finished_rows < rows:
        rates = {k: Rate(items_per_s=speeds[k], max_items=max(v), samples=len(v)) for k, v in done.items()}
        decided = size_round(job(), FLEET, busy={k: 1 for k in running}, rates=rates,
                             running={k: [RunningShard(items=n, elapsed_s=now - (end - n / speeds[k]))]
                                      for k, (end, n) in running.items()},
                             pool=uncut(cut_to, rows) if cut_to < rows else [], batch_size=batch_size, rules=RULES)
        for cut in decided.cuts:
            key = (cut.node_id, cut.device)
            assert cut.start == cut_to
            cut_to = cut.stop
            running[key] = (now + cut.size / speeds[key], cut.size)
            heapq.heappush(events, (running[key][0], key))
            cuts.append((key, cut.size))
        now, key = heapq.heappop(events)
        finished_rows += running.pop(key)[1]
        done.setdefault(key, []).append(next(size for k, size in reversed(cuts) if k == key))
        ends[key] = now
    return now, ends, cuts


def test_a_simulated_job_ends_near_the_ideal_with_every_device_finishing_together() -> None:
    speeds = {("h200", "cuda:0"): 18_000.0, ("h200", "cpu"): 600.0, ("laptop", "cpu"): 300.0}
    rows = 2_000_000
    makespan, ends, cuts = simulate(speeds, rows)
    ideal = rows / sum(speeds.values())
    assert makespan <= ideal * 1.03  # the calibration shards and the tail cost under 3 %
    assert max(ends.values()) - min(ends.values()) < 2.0  # nobody holds up the tail by more than a short shard
    gpu = [size for key, size in cuts if key == ("h200", "cuda:0")]
    assert gpu[:4] == [256, 4096, 16384, 54016] and max(gpu) == 54016  # small first, then its 3 s target
    # Shards of about 3 s each (3 devices over ~106 s), the first few and the tail's smaller: not thousands.
    assert len(cuts) <= 3 * ideal / 3.0 + 15


def test_no_sliver_under_a_batch_is_left_behind_for_a_shard_of_its_own() -> None:
    gpu_only = ShardRequest(job_id="j", index=0, items=0, backends=(BackendName.CUDA,))
    decided = size_round(gpu_only, FLEET, {}, {}, MEASURED, uncut(0, 54_016 + 30), 64, rules=RULES)
    assert [c.size for c in decided.cuts] == [54_046]  # not 54,016 and then a shard of 30 rows


def test_a_cuts_reason_counts_the_rows_it_cut() -> None:
    # The placement line reads `rows START-STOP: WHY`: WHY's count is the cut's, not the size the device was offered
    # (a tail rounded up to whole batches past the last row; a pending shard smaller than the device's size).
    gpu_only = ShardRequest(job_id="j", index=0, items=0, backends=(BackendName.CUDA,))
    tail = size_round(gpu_only, FLEET, {}, {}, MEASURED, uncut(184_330, 200_000), 64, rules=RULES)
    pending = size_round(gpu_only, FLEET, {}, {}, MEASURED, [Range(start=0, stop=1_000, index=3), *uncut(9_000, 99_000)],
                         64, rules=RULES)
    for cut in (*tail.cuts, *pending.cuts):
        assert cut.why.startswith(f"{cut.size:,} rows"), (cut.size, cut.why)
    assert [c.size for c in tail.cuts] == [15_670] and "the tail" in tail.cuts[0].why
    assert pending.cuts[0].why.startswith("1,000 rows (what was left); 54,016 rows = 3 s")
    assert f"h200/cuda:0: {pending.cuts[0].why}" in pending.explanation
