"""The template check (benchmarks/kernels/template_check.py) runs problems in parallel processes sharing one GPU: a
task that ran out of memory beside the others is run again alone (its templates had fallen back to PyTorch and the
timed run left that family out), and the processes are as many as the GPU's free memory holds."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


@pytest.fixture()
def template_check(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(KERNELS))  # the spawned check processes import it by name from there too
    return importlib.import_module("template_check")

# Runs out of memory the first time (as beside other processes), and fits the second time (alone).
GREEDY = '''
from pathlib import Path
import torch

RAN = Path(__file__).with_suffix(".ran")


class Model(torch.nn.Module):
    def forward(self, x):
        if not RAN.exists():
            RAN.touch()
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return x * 2


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
'''

PLAIN = GREEDY.replace("if not RAN.exists():", "if False:")


@pytest.mark.timeout(180)
def test_a_task_out_of_memory_beside_others_is_run_again_alone(template_check: ModuleType,
                                                               tmp_path: Path) -> None:
    (tmp_path / "greedy.py").write_text(GREEDY)
    (tmp_path / "plain.py").write_text(PLAIN)
    checked = template_check.check_all([tmp_path / "greedy.py", tmp_path / "plain.py"], ["ieee"], workers=2,
                                       time_limit_s=100, compile_warm=False, device="cpu")
    assert checked["retried_alone"] == 1
    assert "error" not in checked["problems"]["greedy"], checked["problems"]["greedy"]
    assert checked["tasks_done"] == 2


def test_out_of_memory_is_seen_wherever_the_check_recorded_it(template_check: ModuleType) -> None:
    assert template_check.out_of_memory({"error": "OutOfMemoryError: CUDA out of memory. Tried to allocate"})
    assert template_check.out_of_memory({"precisions": {"tf32": {"failures": {"softmax": "CUDA out of memory"}}}})
    assert not template_check.out_of_memory({"precisions": {"tf32": {"error": "incorrect"}}})


def test_the_check_processes_are_as_many_as_free_memory_holds(template_check: ModuleType) -> None:
    gib = 1 << 30
    assert template_check.workers_for(140 * gib, 12, 8 * gib) == 12
    assert template_check.workers_for(40 * gib, 12, 8 * gib) == 5
    assert template_check.workers_for(2 * gib, 12, 8 * gib) == 1
