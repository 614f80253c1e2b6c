"""The speed of light in the kernel reports: its arithmetic (the larger of FLOPs at the fp32 peak and bytes at the
memory bandwidth, from the device's recorded figures), each winner's share with its bound, and the columns of the
tune table, the evaluator's rows and kernel-eval results."""

from __future__ import annotations

import io
import math
from dataclasses import replace

import pytest
import torch
from rich.console import Console

from farm.cli.kernels import kernel_results_table, results_table, row
from farm.core.kernels import KernelResult, RewardMode
from farm.core.tuning import Objective
from farm.core.speed_of_light import device_peaks, speed_of_light
from farm_agent.work.kinds.kernel_eval import row as kernel_row
from farm_agent.tuner.flops import flop_counter
from farm_agent.tuner.evaluator import Result
from farm_agent.tuner.tune import Trial, TuneReport, format_table, summarize, table_row

H200 = "NVIDIA H200"


@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"])
def test_pairwise_distances_count_their_product(mode: str) -> None:
    # FlopCounterMode has no formula for cdist: its speed of light was its bytes alone (3.4 % for 69 GFLOP)
    x, y = torch.randn(2, 40, 7, device="meta"), torch.randn(2, 30, 7, device="meta")
    with torch.no_grad(), flop_counter() as counter:
        torch.cdist(x, y, compute_mode=mode)
        torch.randn(8, 4, device="meta") @ torch.randn(4, 5, device="meta")  # the rest counted as before
    assert counter.get_total_flops() == 2 * 2 * 40 * 30 * 7 + 2 * 8 * 4 * 5


def test_the_bound_is_the_larger_of_compute_and_memory_time() -> None:
    compute = speed_of_light(flops=2 * 67e9, nbytes=4.8e9, device_name=H200)  # 2 ms of FLOPs, 1 ms of bytes
    assert compute is not None and compute.bound == "compute"
    assert math.isclose(compute.ms, 2.0) and math.isclose(compute.memory_ms, 1.0)
    memory = speed_of_light(flops=67e9, nbytes=3 * 4.8e9, device_name=H200)
    assert memory is not None and memory.bound == "memory" and math.isclose(memory.ms, 3.0)
    assert math.isclose(memory.share(6.0) or 0, 0.5)
    assert memory.share(None) is None and memory.share(0.0) is None


def test_peaks_are_the_recorded_figures_of_the_device_and_unknown_devices_have_none() -> None:
    assert device_peaks("NVIDIA H100 PCIe").name == "H100 PCIe"  # type: ignore[union-attr]
    assert device_peaks("NVIDIA H100 80GB HBM3").bytes_per_s == 3.35e12  # type: ignore[union-attr]
    assert device_peaks(H200).describe() == "H200: 67 TFLOP/s fp32, 4.8 TB/s"  # type: ignore[union-attr]
    assert speed_of_light(1e9, 1e9, "cpu") is None
    assert speed_of_light(0, 0, H200) is None


def _trial(name: str, ms: float, strict: bool = True, lowers: bool = False) -> Trial:
    return Trial(candidate=name, lowers_precision=lowers, compiled=True, correct=True, correct_strict=strict,
                 correct_loose=True, median_ms=ms, max_abs_err=0.0, rel_norm_err=0.0, seconds=1.0, searched=True)


def _report() -> TuneReport:
    trials = [_trial("eager", 4.0), _trial("compile-default", 3.0), _trial("triton-templates", 2.0),
              _trial("triton-templates-3xtf32", 1.0), _trial("autocast-fp16", 0.5, strict=False, lowers=True)]
    return TuneReport(problem="convT", device="cuda", device_name=H200, atol=1e-2, rtol=1e-2, budget_s=60,
                      features={}, order=[t.candidate for t in trials], trials=trials, skipped=[], stop_reason="x",
                      seconds=12.0, flops=67e9 * 0.4, nbytes=4.8e9 * 0.1)  # 0.4 ms of compute, 0.1 of memory


def test_each_scoring_reports_its_picks_share_and_the_bound() -> None:
    report = _report()
    assert report.pick("strict").candidate == "triton-templates-3xtf32"  # type: ignore[union-attr]
    assert report.pick("strict-ieee").candidate == "triton-templates"  # type: ignore[union-attr]
    assert report.pick("loose").candidate == "autocast-fp16"  # type: ignore[union-attr]
    assert math.isclose(report.sol_share("strict") or 0, 0.4)
    assert math.isclose(report.sol_share("strict-ieee") or 0, 0.2)
    row_ = table_row(report, "strict")
    assert row_["sol_bound"] == "compute" and math.isclose(row_["sol_ms"], 0.4) and row_["emulated_fp32"]
    assert math.isclose(summarize([report], "strict-ieee").geomean_sol_share or 0, 0.2)
    data = report.to_json()
    assert data["speed_of_light"]["bound"] == "compute" and math.isclose(data["sol_share"]["loose"], 0.8)


def test_the_tune_table_has_the_share_the_bound_and_the_peaks() -> None:
    text = format_table([_report()], "strict")
    header, line = text.splitlines()[:2]
    assert "SoL ms" in header and "of SoL" in header and "bound" in header and "search s" in header
    assert "triton-templates-3xtf32 \u2020" in line and "40.0%" in line and "compute" in line
    assert "geomean share of the speed of light 40.0%" in text
    assert text.splitlines()[-1].endswith("H200: 67 TFLOP/s fp32, 4.8 TB/s")


def test_one_energy_run_gives_both_objectives_tables_and_never_divides_joules_by_milliseconds() -> None:
    # A run under energy holds each trial's time and joules: the 3xtf32 templates are fastest, the plain ones use
    # the fewest joules (time and energy disagree); compile-default has no joules (its energy run failed).
    joules = {"eager": 0.8, "triton-templates": 0.3, "triton-templates-3xtf32": 0.5}
    trials = [replace(t, joules_per_call=joules.get(t.candidate)) for t in _report().trials]
    report = replace(_report(), trials=trials, objective=Objective.ENERGY)
    assert report.pick("strict", Objective.TIME).candidate == "triton-templates-3xtf32"  # type: ignore[union-attr]
    assert report.pick("strict").candidate == "triton-templates"  # type: ignore[union-attr]  # the report's own
    assert math.isclose(report.speedup("eager", "strict", Objective.ENERGY) or 0, 0.8 / 0.3)
    assert math.isclose(report.speedup("eager", "strict", Objective.TIME) or 0, 4.0)
    assert report.speedup("compile-default", "strict", Objective.ENERGY) is None  # not 3.0 ms / 0.3 J
    by_energy = summarize([report], "strict", objective=Objective.ENERGY)
    assert by_energy.fast_p == 0.0 and by_energy.geomean_vs_compile is None and by_energy.objective is Objective.ENERGY
    assert math.isclose(summarize([report], "strict").fast_p, 1.0)  # 3.0 ms against 1.0 ms
    text = format_table([report], "strict", objective=Objective.ENERGY)
    header, line = text.splitlines()[:2]
    assert "eager J" in header and "compile J" in header and header.rstrip().endswith("ms")
    assert line.split()[:3] == ["convT", "triton-templates", "0.3000"] and "2.67x" in line
    assert "strict (energy): fast_0.05 0.0% of 1 (correct and >5% fewer joules a call" in text


def _result(name: str, ms: float, correct: bool = True) -> Result:
    return Result(problem="p", candidate=name, compiled=True, correct=correct, max_abs_err=0.0, rel_norm_err=0.0,
                  max_scaled_err=0.0, median_ms=ms, runs=20, error="", sound=True, flops=0.0, bytes=4.8e9,
                  device_name=H200)


def render(table: object) -> str:
    out = io.StringIO()
    Console(file=out, width=250).print(table)
    return out.getvalue()


def test_evaluator_rows_and_kernel_eval_rows_carry_the_share() -> None:
    results = [_result("eager", 2.0), _result("compile-default", 1.0), _result("file:mine", 4.0, correct=False)]
    rows = [row(r, results) for r in results]
    assert math.isclose(rows[0]["sol_share"], 0.5) and rows[0]["sol_bound"] == "memory"
    assert rows[2]["sol_share"] is None  # incorrect: no share
    text = render(results_table("p on cuda", rows))
    assert "OF SOL" in text and "50% mem" in text and "H200: 67 TFLOP/s fp32, 4.8 TB/s" in text
    eval_row = kernel_row("p", "mine", results[1], 2.0, 1.0, RewardMode.SPEEDUP, 0.05, "cuda:0")
    assert math.isclose(eval_row.sol_share or 0, 1.0) and eval_row.sol_bound == "memory"
    assert "100% mem" in render(kernel_results_table("job", [eval_row]))


def test_rows_written_before_the_share_existed_still_read() -> None:
    old = {"problem": "p", "candidate": "c", "compiled": True, "correct": True, "max_abs_err": 0.0,
           "rel_norm_err": 0.0, "median_ms": 1.0, "eager_ms": 1.0, "compile_ms": 1.0, "speedup_vs_eager": 1.0,
           "speedup_vs_compile": 1.0, "reward": 1.0, "error": ""}
    result = KernelResult.from_dict(old)
    assert result.sol_share is None and result.sol_bound == ""
    assert "OF SOL" in render(kernel_results_table("job", [result]))
