"""A winner the farm shares comes from a node's report: a hostile lender chooses which known transform every node
of its GPU kind then runs for that model. The head checks the report's form (farm.core.tuning.check_outcome:
tests/unit/test_tuning_arithmetic.py); a node taking the winner checks what it means for its own job: a precision
the job's tolerance allows, and answers within that tolerance on its own batch, or it runs the model untuned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from farm.core.tuning import SharedWinner, WinnerKey


def _shared(model: nn.Module, batch: torch.Tensor, rtol: float, family: str,
            params: tuple[tuple[str, object], ...] = ()) -> tuple[object, SharedWinner]:
    from farm_agent.tuner.cache import make_key

    key = make_key(model, [batch], 1e-4, rtol, "cpu")
    wk = WinnerKey(key.device_name, key.driver, key.torch_version, "m", key.input_shapes, 1e-4, rtol,
                   key.objective)  # type: ignore[arg-type]
    return key, SharedWinner(wk, family, params)  # type: ignore[arg-type]


def test_a_shared_winner_in_a_precision_the_job_does_not_allow_is_not_taken() -> None:
    from farm_agent.tuner.tune import shared_winner

    model, batch = nn.Linear(8, 4).eval(), torch.rand(16, 8)
    strict, fp16 = _shared(model, batch, 1e-4, "autocast-fp16")
    assert shared_winner(strict, [fp16]) is None  # type: ignore[arg-type]
    loose, fp16 = _shared(model, batch, 1e-2, "autocast-fp16")
    assert shared_winner(loose, [fp16]) is not None  # type: ignore[arg-type]  # where the job allows it


def test_a_shared_winner_that_answers_wrongly_here_is_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A known transform that is wrong for this model on this node (as a kernel wrong on one shape would be): the
    node checks it on its own batch before it runs a row, and runs the model untuned, saying why."""
    import farm_agent.tuner.tune as tune
    from farm_agent.tuner.cache import WinnerCache

    torch.manual_seed(0)
    model, batch = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval(), torch.rand(16, 8)
    _, winner = _shared(model, batch, 1e-4, "compile-default")
    built = tune.build

    def off_by_a_little(candidate, module, inputs, params):  # type: ignore[no-untyped-def]
        forward = built(candidate, module, inputs, params)
        return lambda x: forward(x) * 1.01

    monkeypatch.setattr(tune, "build", off_by_a_little)
    forward, outcome = tune.tuned_forward(model, batch, (1e-4, 1e-4), "cpu", WinnerCache(tmp_path / "node"),
                                          shared=[winner])
    assert outcome.winner == "" and "outside the job's tolerance" in outcome.reason
    assert "outside the job's tolerance" in capsys.readouterr().err
    with torch.no_grad():
        torch.testing.assert_close(forward(batch), model(batch))

    monkeypatch.setattr(tune, "build", built)  # the same winner, right: run
    _, outcome = tune.tuned_forward(model, batch, (1e-4, 1e-4), "cpu", WinnerCache(tmp_path / "node"),
                                    shared=[winner])
    assert outcome.winner == "compile-default"


def test_a_shared_winner_that_fails_on_this_nodes_batch_is_not_run_and_the_reason_says_how(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A winner that builds but raises on the node's batch (a compiler failing here, as Inductor did once a test
    left its config broken) is not run, and the reason names the error rather than calling it a wrong answer."""
    import farm_agent.tuner.tune as tune
    from farm_agent.tuner.cache import WinnerCache

    model, batch = nn.Linear(8, 4).eval(), torch.rand(16, 8)
    _, winner = _shared(model, batch, 1e-4, "compile-default")

    def breaks_here(candidate, module, inputs, params):  # type: ignore[no-untyped-def]
        def forward(x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("no C++ compiler on this node\nmore detail")
        return forward

    monkeypatch.setattr(tune, "build", breaks_here)
    forward, outcome = tune.tuned_forward(model, batch, (1e-4, 1e-4), "cpu", WinnerCache(tmp_path / "node"),
                                          shared=[winner])
    assert outcome.winner == ""
    assert "fails on this node's batch (RuntimeError: no C++ compiler on this node)" in outcome.reason
    assert "outside the job's tolerance" not in outcome.reason
    assert "fails on this node's batch" in capsys.readouterr().err
    with torch.no_grad():
        torch.testing.assert_close(forward(batch), model(batch))
