"""The benchmark problems (benchmarks/kernels/problems/) keep the common format and their H200 sizing, checked on
the meta device: shapes and FLOPs without allocating or computing anything, so CI never runs a full-size forward."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from farm.core.errors import NotFoundError, SpecError
from farm_agent.tuner.flops import flop_counter
from farm_agent.tuner.problem import MODEL_SEED, load_problem, problem_paths

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "benchmarks" / "kernels" / "problems"
FIXTURES = ROOT / "tests" / "fixtures" / "kernels" / "problems"
PATHS = problem_paths(PROBLEMS)

# A rough eager fp32 time on an H200, from below: the larger of FLOPs at the ~50 TFLOP/s fp32 GEMMs reach and bytes
# (inputs, outputs, parameters, each once) at ~3 TB/s of HBM. Eager is at least this slow.
FP32_FLOPS, HBM_BYTES = 50e12, 3e12


def test_there_are_at_least_thirty_problems_of_every_kind() -> None:
    names = {p.stem for p in PATHS}
    assert len(names) >= 30
    for needed in ("gemm_square", "conv2d_3x3", "row_sum", "layer_norm", "gelu", "gemm_bias_gelu", "conv_bn_silu",
                   "mlp_block", "small_cnn", "transformer_block"):
        assert needed in names


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_problem_keeps_the_format_and_its_size(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring and "\n" not in docstring, "one-line docstring"
    problem = load_problem(path)
    assert problem.name == path.stem
    model = problem.model("meta")
    inputs = problem.inputs("meta", seed=1)
    assert inputs and all(isinstance(v, torch.Tensor) for v in inputs)
    with torch.no_grad(), flop_counter() as counter:  # the evaluator's count
        out = model(*inputs)
    outputs = list(out) if isinstance(out, tuple) else [out]
    assert all(isinstance(o, torch.Tensor) and o.dtype == torch.float32 for o in outputs)
    assert all(v.dtype in (torch.float32, torch.int64) for v in inputs)  # fp32 problems (indices aside)
    moved = sum(t.numel() * t.element_size() for t in [*inputs, *outputs, *model.parameters(), *model.buffers()])
    estimate_ms = max(counter.get_total_flops() / FP32_FLOPS, moved / HBM_BYTES) * 1e3
    assert 0.7 <= estimate_ms <= 100, f"{estimate_ms:.2f} ms"
    assert moved < 10e9  # the evaluator keeps several copies of inputs and outputs on the GPU


def test_problem_inputs_are_seeded_and_models_deterministic() -> None:
    problem = load_problem(FIXTURES / "linear_gelu.py")
    a, b, c = (problem.inputs("cpu", seed=s)[0] for s in (5, 5, 6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert bool(a.ne(0).all())
    first, second = problem.model("cpu"), problem.model("cpu")
    assert not first.training
    assert torch.equal(first.linear.weight, second.linear.weight)
    torch.manual_seed(MODEL_SEED)
    assert torch.equal(first.linear.weight, torch.nn.Linear(64, 64).weight)  # built under MODEL_SEED


def test_bad_problem_files_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="defines no Model"):
        load_problem(FIXTURES / "no_model.py")
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise RuntimeError('no GPU driver')\n")
    with pytest.raises(SpecError, match="broken.py does not import: RuntimeError: no GPU driver"):
        load_problem(broken)
    not_a_module = tmp_path / "not_module.py"
    not_a_module.write_text("Model = 3\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n")
    with pytest.raises(SpecError, match="not a torch.nn.Module subclass"):
        load_problem(not_a_module)
    with pytest.raises(NotFoundError):
        load_problem(tmp_path / "absent.py")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotFoundError, match="no problem files"):
        problem_paths(empty)


def test_problem_paths_lists_a_folder_sorted_without_helpers(tmp_path: Path) -> None:
    for name in ("b.py", "a.py", "_helper.py", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [p.name for p in problem_paths(tmp_path)] == ["a.py", "b.py"]
    assert problem_paths(tmp_path / "a.py") == [(tmp_path / "a.py").resolve()]
