"""`farm kernels eval` as a user runs it, on the CPU: the real command line, evaluator children and torch.compile."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.conftest import FIXTURES, farm

KERNELS = FIXTURES / "kernels"
PROBLEM = KERNELS / "problems" / "linear_gelu.py"
HONEST = KERNELS / "candidates" / "honest_linear_gelu.py"


def test_eval_prints_correctness_times_and_speedups_against_eager_and_compile() -> None:
    done = farm("kernels", "eval", str(PROBLEM), "--candidate", str(HONEST), "--device", "cpu", "--json", timeout=240)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["device"] == "cpu" and data["atol"] == 1e-4
    rows = {r["candidate"]: r for r in data["results"]}
    assert list(rows) == ["eager", "compile-default", "file:honest_linear_gelu"]
    eager, compiled, honest = rows["eager"], rows["compile-default"], rows["file:honest_linear_gelu"]
    assert eager["correct"] and eager["speedup_vs_eager"] == 1.0 and eager["runs"] == 20
    assert honest["correct"] and honest["median_ms"] > 0
    assert honest["speedup_vs_eager"] == pytest.approx(eager["median_ms"] / honest["median_ms"])
    if compiled["correct"]:
        assert honest["speedup_vs_compile_default"] == pytest.approx(compiled["median_ms"] / honest["median_ms"])
    else:  # a machine where inductor cannot build: reported, not fatal
        assert not compiled["compiled"] and compiled["error"] and honest["speedup_vs_compile_default"] is None


def test_eval_table_names_every_candidate_and_the_reason_a_cheat_failed() -> None:
    cheat = KERNELS / "candidates" / "cheat_wrong_shape.py"
    done = farm("kernels", "eval", str(KERNELS / "problems" / "relu.py"), "--candidate", str(cheat),
                "--device", "cpu", env={"COLUMNS": "250"}, timeout=240)
    assert done.returncode == 0, done.stderr
    for text in ("relu on cpu", "eager", "compile-default", "file:cheat_wrong_shape", "rejected: output 0 is",
                 "VS COMPILE"):
        assert text in done.stdout, done.stdout


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


def test_problem_path_resolves_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(PROBLEM.read_text())
    done = farm("kernels", "eval", "p.py", "--device", "cpu", "--json", cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"][0]["candidate"] == "eager"
