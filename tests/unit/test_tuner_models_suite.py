"""benchmarks/kernels/models: at least 12 whole models, each a loadable problem whose forward runs (shapes only,
on the meta device: no memory, no compute)."""

from __future__ import annotations

from pathlib import Path

from farm_agent.tuner.problem import load_problem, problem_paths

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "models"


def test_the_whole_model_suite_loads_and_runs_on_meta() -> None:
    paths = problem_paths(MODELS)
    assert len(paths) >= 12
    for path in paths:
        problem = load_problem(path)
        out = problem.model("meta")(*problem.inputs("meta", seed=0))
        assert out.shape[0] == problem.inputs("meta", seed=0)[0].shape[0], path.stem
