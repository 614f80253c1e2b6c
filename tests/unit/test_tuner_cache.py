"""The winner cache: one entry per (device, driver, torch, model, input shapes, tolerance), read back exactly."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from farm.core.tuning import Objective
from farm_agent.tuner.cache import Winner, WinnerCache, make_key, model_hash
from farm_agent.tuner.candidates import Untuned

PROBLEMS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels" / "problems"


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_put_winner_is_found_under_the_same_key_only(tmp_path: Path) -> None:
    cache = WinnerCache(tmp_path)
    model, inputs = small_model(), [torch.randn(32, 8)]
    key = make_key(model, inputs, atol=1e-4, rtol=1e-4, device="cpu")
    winner = Winner(candidate="compile-default", params={}, lowers_precision=False, median_ms=0.5, eager_ms=1.0,
                    compile_ms=0.5)
    cache.put(key, winner)

    assert WinnerCache(tmp_path).get(key) == winner
    assert cache.get(make_key(model, [torch.randn(64, 8)], 1e-4, 1e-4, "cpu")) is None  # other shapes
    assert cache.get(make_key(model, inputs, 1e-2, 1e-2, "cpu")) is None  # another tolerance
    assert cache.get(make_key(small_model(seed=1), inputs, 1e-4, 1e-4, "cpu")) is None  # other weights
    assert cache.get(make_key(model, inputs, 1e-4, 1e-4, "cpu", Objective.ENERGY)) is None  # another objective


def test_the_model_hash_follows_weights_and_structure_not_identity() -> None:
    assert model_hash(small_model()) == model_hash(small_model())
    assert model_hash(small_model()) != model_hash(small_model(seed=1))
    changed = small_model()
    changed[1] = nn.GELU()
    assert model_hash(changed) != model_hash(small_model())


def test_the_key_names_this_machine_and_torch(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FARM_STATE_DIR", str(tmp_path))
    key = make_key(small_model(), [torch.randn(2, 8)], 1e-4, 1e-4, "cpu")
    assert key.torch_version == torch.__version__ and key.driver == "none" and key.device_name
    assert key.input_shapes == ("float32[2, 8]",)
    path = WinnerCache().put(key, Winner("eager", {}, False, 1.0, 1.0, None))
    assert path.parent == tmp_path / "tuner" / "cache"


def test_tuned_module_runs_the_cached_winner_and_falls_back_to_the_module(tmp_path: Path) -> None:
    from farm_agent.tuner.tune import tuned_module

    cache = WinnerCache(tmp_path)
    model, batch = small_model().eval(), torch.randn(16, 8)
    untuned = tuned_module(model, batch, device="cpu", cache=cache)
    assert isinstance(untuned, Untuned) and untuned.model is model  # nothing cached: the model as it runs untuned
    key = make_key(model, [batch], 1e-4, 1e-4, "cpu")
    cache.put(key, Winner("triton-fused", {"precision": "ieee"}, False, 1.0, 2.0, 1.5))
    tuned = tuned_module(model, batch, device="cpu", cache=cache)
    assert tuned is not model  # the rewritten model (its Triton modules run PyTorch's code on a CPU)
    with torch.no_grad():
        torch.testing.assert_close(tuned(batch), model(batch))


def test_tune_module_tunes_a_job_model_and_caches_it_under_that_model(tmp_path: Path) -> None:
    from farm_agent.tuner.policy import Policy
    from farm_agent.tuner.tune import tune_module

    cache = WinnerCache(tmp_path)
    model, batch = small_model().eval(), torch.rand(16, 8) * 4
    report = tune_module(model, batch, device="cpu", budget_s=0.0, cache=cache, policy=Policy())
    assert report.winner in {"eager", "compile-default"} and report.trial("eager").correct
    winner = cache.get(make_key(model, [batch], 1e-4, 1e-4, "cpu"))
    assert winner is not None and winner.candidate == report.winner


def test_a_second_job_with_the_same_model_tunes_nothing(tmp_path: Path, capsys) -> None:
    """The first job's tuning run caches its winner under (device, driver, torch, model, shapes, tolerance,
    objective); the next job's worker, with a model loaded anew, finds it and tunes nothing."""
    from farm_agent.tuner.tune import tuned_module

    batch = torch.rand(16, 8)
    tuned_module(small_model().eval(), batch, device="cpu", cache=WinnerCache(tmp_path), tune_first=True,
                 budget_s=1.0, objective=Objective.ENERGY)
    assert "farm tuner: tuning" in capsys.readouterr().err
    [entry] = list(tmp_path.glob("*.json"))
    written = entry.stat().st_mtime_ns

    tuned_module(small_model().eval(), batch, device="cpu", cache=WinnerCache(tmp_path), tune_first=True,
                 budget_s=1.0, objective=Objective.ENERGY)
    assert "tuning" not in capsys.readouterr().err  # a cache hit: no plan, no run
    assert [entry] == list(tmp_path.glob("*.json")) and entry.stat().st_mtime_ns == written


def test_a_job_with_few_rows_left_does_not_tune(tmp_path: Path, capsys) -> None:
    from farm_agent.tuner.tune import tuned_module

    model = small_model().eval()
    tuned = tuned_module(model, torch.rand(16, 8), device="cpu", cache=WinnerCache(tmp_path), tune_first=True,
                         budget_s=120.0, rows_left=1000)
    assert "not tuning: not worth it" in capsys.readouterr().err
    assert isinstance(tuned, Untuned) and not list(tmp_path.glob("*.json"))


def local_model() -> nn.Module:
    """A model whose class its builder defines inside itself, as job code often does: pickle cannot save it."""
    class Doubled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = small_model()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * 2

    return Doubled().eval()


def test_a_model_whose_class_is_local_to_its_builder_is_tuned(tmp_path: Path) -> None:
    """On an H100 a tuned job's shards failed with `Can't pickle local object 'convnext.<locals>.ConvNeXt'`: the
    tuner saved the model whole for its evaluator's process with pickle."""
    from farm_agent.tuner.policy import Policy
    from farm_agent.tuner.tune import tune_module

    model, batch = local_model(), torch.rand(16, 8)
    report = tune_module(model, batch, device="cpu", budget_s=0.0, cache=WinnerCache(tmp_path), policy=Policy())
    assert report.trial("eager").correct and report.winner in {"eager", "compile-default"}


def test_a_tuning_run_that_fails_leaves_the_model_untuned_and_says_why(tmp_path: Path, monkeypatch) -> None:
    from farm_agent.tuner import tune

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the evaluator's process died\nits last words")

    monkeypatch.setattr(tune, "tune_module", broken)
    model, batch = small_model().eval(), torch.rand(16, 8)
    forward, outcome = tune.tuned_forward(model, batch, (1e-4, 1e-4), "cpu", WinnerCache(tmp_path), tune_first=True,
                                          budget_s=30.0)
    assert isinstance(forward, Untuned) and not outcome.winner
    assert outcome.reason.endswith("; the tuning run failed (RuntimeError: the evaluator's process died): the model "
                                   "runs untuned")
    assert torch.equal(forward(batch), model(batch))


def test_the_tuning_budget_holds_for_the_whole_run(tmp_path: Path) -> None:
    """A job's 20 s budget took 73.9 s on an H100: the first round always measured the baselines, compiles and all.
    Past its budget a run measures eager (the reference) and nothing more, and says why; a job's run does not
    measure compile-default as the reports' baseline at all (only as a candidate the policy ranks)."""
    from farm_agent.tuner.evaluator import OUT_OF_BUDGET
    from farm_agent.tuner.policy import Policy
    from farm_agent.tuner.tune import tune, tune_module

    model, batch = small_model().eval(), torch.rand(16, 8)
    policy = Policy()
    report = tune_module(model, batch, device="cpu", budget_s=0.0, cache=WinnerCache(tmp_path), policy=policy)
    assert report.trial("eager").correct and report.winner == "eager"
    assert report.trial("compile-default") is None and "compile-default" in report.skipped
    assert "compile-default" not in policy.arms  # not measured: the policy learns nothing of it

    report = tune(PROBLEMS / "relu.py", device="cpu", budget_s=0.0, cache=WinnerCache(tmp_path), policy=policy)
    compiled = report.trial("compile-default")  # a report's run: measured as its baseline, or said why not
    assert compiled is not None and not compiled.correct and compiled.error == OUT_OF_BUDGET
    assert "compile-default" not in policy.arms


def test_a_tuning_run_reports_each_candidate_s_figures(tmp_path: Path) -> None:
    """A tuned job's --explain named no candidate (an H100's tuned job: 'no candidate beat the untuned model', and
    which were measured, at what cost, nobody could tell). The shard's outcome now carries each candidate's ms per
    call, or why it has none."""
    from farm_agent.tuner.tune import tuned_forward

    model, batch = small_model().eval(), torch.rand(16, 8)
    _, outcome = tuned_forward(model, batch, (1e-4, 1e-4), "cpu", WinnerCache(tmp_path), tune_first=True,
                               budget_s=0.0)
    by_name = {c.name: c for c in outcome.candidates}
    assert by_name["eager"].ms is not None and by_name["eager"].ms > 0 and not by_name["eager"].note
    assert by_name["eager"].seconds is not None and by_name["eager"].seconds > 0  # what measuring it took
    assert by_name["compile-default"].ms is None and by_name["compile-default"].seconds is None
    assert by_name["compile-default"].note == "not tried: budget"
    assert outcome.tuning_s > 0


def test_the_tuning_budget_counts_from_the_run_s_start(tmp_path: Path, monkeypatch) -> None:
    """A job's 20 s budget still took 28.4 s on an H100: the deadline began after the model was saved. It now begins
    where the tuning run does: saving the model (slowed here by 1 s) is spent from it."""
    import time

    from farm_agent.tuner import tune

    deadlines: list[float] = []
    run, save_whole = tune.Evaluation.run, tune.save_whole

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        deadlines.append(kwargs["deadline"])
        return run(*args, **kwargs)

    def slow_save(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(1.0)
        return save_whole(*args, **kwargs)

    monkeypatch.setattr(tune.Evaluation, "run", recorded)
    monkeypatch.setattr(tune, "save_whole", slow_save)
    began = time.monotonic()
    tune.tuned_forward(small_model().eval(), torch.rand(16, 8), (1e-4, 1e-4), "cpu", WinnerCache(tmp_path),
                       tune_first=True, budget_s=2.0)
    assert deadlines and max(deadlines) <= began + 2.0 + 0.5, [d - began for d in deadlines]


def conv_mlp() -> nn.Module:
    """A convolution, a LayerNorm and a channel MLP (nn.Linear over the last axis), as ConvNeXt blocks do."""
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm, self.mlp = nn.Conv2d(3, 8, 3, padding=1), nn.LayerNorm(8), nn.Linear(8, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mlp(self.norm(self.conv(x).permute(0, 2, 3, 1)))

    return Block().eval()


def test_a_model_s_features_are_the_same_inside_inference_mode() -> None:
    """A shard runs its model, and so the tuner, inside torch.inference_mode: there the features counted no matrix
    product and no convolution (`linear` and `conv2d` seen undecomposed), so on an H100 a ConvNeXt job's tuning run
    offered no pytorch-defaults baseline and no TF32 or autocast family."""
    from farm_agent.tuner.features import model_features

    model, batch = conv_mlp(), torch.rand(4, 3, 8, 8)
    outside = model_features(model, [batch], 1e-4).shares
    with torch.inference_mode():
        inside = model_features(model, [batch], 1e-4).shares
    assert outside["matmul"] > 0 and outside["conv"] > 0
    assert inside == outside


def test_a_tuning_run_made_inside_inference_mode_sees_the_model_s_products(tmp_path: Path) -> None:
    from farm_agent.tuner import tune

    model = conv_mlp()
    with torch.inference_mode():  # as the cuda backend runs a shard's tuned_forward
        batch = torch.rand(4, 3, 8, 8)
        *_, report = tune._tuning_run(model, batch, (1e-4, 1e-4), "cpu", 0.0, WinnerCache(tmp_path),
                                      Objective.TIME)
    assert report.features["shares"]["matmul"] > 0 and report.features["shares"]["conv"] > 0


def test_a_report_read_back_from_its_json_is_the_same_report(tmp_path: Path) -> None:
    """tune_h200.py --merge and tune_models.py --merge make one suite's tables from the JSON of runs in parts: the
    report read back must judge as the one written (to_json's derived figures are made again, not read)."""
    import json

    from farm_agent.tuner.tune import TuneReport, tune

    report = tune(PROBLEMS / "relu.py", device="cpu", budget_s=5.0, cache=WinnerCache(tmp_path), runs=3)
    back = TuneReport.from_json(json.loads(json.dumps(report.to_json(), default=str)))
    assert back == report
    assert back.pick("strict") == report.pick("strict") and back.speedup("eager") == report.speedup("eager")
