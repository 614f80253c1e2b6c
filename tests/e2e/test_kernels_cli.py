"""`farm kernels eval` as a user runs it, on the CPU: the real command line, evaluator children and torch.compile."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from rich.console import Console

from farm.cli.kernels import results_table
from tests.conftest import FIXTURES, farm

KERNELS = FIXTURES / "kernels"
PROBLEM = KERNELS / "problems" / "linear_gelu.py"
HONEST = KERNELS / "candidates" / "honest_linear_gelu.py"


def test_eval_prints_correctness_times_and_speedups_against_eager_and_compile() -> None:
    # A candidate written for another problem: its ModelNew takes no constructor argument, so it does not build.
    other = KERNELS / "candidates" / "cheat_wrong_shape.py"
    done = farm("kernels", "eval", str(PROBLEM), "--candidate", str(HONEST), "--candidate", str(other),
                "--device", "cpu", "--json", timeout=240)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["device"] == "cpu" and data["atol"] == 1e-4
    rows = {r["candidate"]: r for r in data["results"]}
    assert list(rows) == ["eager", "compile-default", "file:honest_linear_gelu", "file:cheat_wrong_shape"]
    eager, compiled, honest = rows["eager"], rows["compile-default"], rows["file:honest_linear_gelu"]
    assert eager["correct"] and eager["speedup_vs_eager"] == 1.0 and eager["runs"] == 20
    assert honest["correct"] and honest["median_ms"] > 0
    assert honest["speedup_vs_eager"] == pytest.approx(eager["median_ms"] / honest["median_ms"])
    if compiled["correct"]:
        assert honest["speedup_vs_compile_default"] == pytest.approx(compiled["median_ms"] / honest["median_ms"])
    else:  # a machine where inductor cannot build: reported, not fatal
        assert not compiled["compiled"] and compiled["error"] and honest["speedup_vs_compile_default"] is None
    unbuilt = rows["file:cheat_wrong_shape"]
    assert not unbuilt["compiled"] and not unbuilt["correct"]
    assert unbuilt["error"].startswith("build failed: TypeError: ModelNew.__init__() takes 1 positional argument")
    assert unbuilt["speedup_vs_eager"] is None and unbuilt["max_abs_err"] is None  # never compared

    # Without --json the same rows are a table (rendered here rather than by a second run: a run compiles).
    console = Console(width=250, record=True)
    console.print(results_table("linear_gelu on cpu (atol 0.0001, rtol 0.0001)", data["results"]))
    table = console.export_text()
    for text in ("linear_gelu on cpu", "CANDIDATE", "COMPILED", "CORRECT", "MAX ERR", "REL NORM ERR", "MEDIAN MS",
                 "VS EAGER", "VS COMPILE", "file:honest_linear_gelu", "1.00x", "build failed: TypeError"):
        assert text in table, table


def bad_inputs() -> list[tuple[list[str], str]]:
    problems, candidates = KERNELS / "problems", KERNELS / "candidates"
    cases = [
        ([str(problems / "nope.py")], "not found"),
        ([str(problems / "no_model.py")], "defines no Model"),
        ([str(PROBLEM), "--candidate", str(candidates / "no_model_new.py")], "defines no class ModelNew"),
        ([str(PROBLEM), "--device", "tpu"], "use cuda, cuda:N or cpu"),
    ]
    if not torch.cuda.is_available():
        cases.append(([str(PROBLEM), "--device", "cuda"], "no CUDA GPU"))
    return cases


def test_bad_input_gets_one_line_and_exit_code_2() -> None:
    cases = bad_inputs()
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:  # each is a fresh interpreter importing torch
        done = list(pool.map(lambda case: farm("kernels", "eval", *case[0], timeout=120), cases))
    for (args, fragment), result in zip(cases, done, strict=True):
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], (args, result.stderr)
        assert result.stdout == ""
