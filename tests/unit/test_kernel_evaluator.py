"""The hardened evaluator on real child processes and real torch (CPU here; the CUDA-only cheat is skipped without a
GPU). Every cheating candidate in tests/fixtures/kernels/candidates/ is shown rejected, each for its own reason."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from farm.core.errors import NotFoundError, SpecError, UserError
from farm_agent.tuner.evaluator import Candidate, Result, evaluate, excess_bound, file_candidate

KERNELS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
PROBLEMS = KERNELS / "problems"
CANDIDATES = KERNELS / "candidates"


def candidate(name: str) -> Candidate:
    return file_candidate(CANDIDATES / f"{name}.py")


def by_name(results: list[Result]) -> dict[str, Result]:
    return {r.candidate: r for r in results}


# Every cheat against the ReLU problem, in one evaluation (a child each, four at a time): each must be rejected with
# the reason given here, and the honest candidate next to them must still pass.
RELU_CHEATS: dict[str, str | tuple[str, ...]] = {
    "cheat_cache_first": "incorrect:",  # the first seed's answer is wrong for the next seeds
    "cheat_alias_input": "rejected: output 0 aliases an input",
    "cheat_alias_view": "rejected: output 0 aliases an input",
    "cheat_thread": "rejected: left thread",
    "cheat_patch_perf_counter": "rejected: patched time.perf_counter",
    "cheat_patch_elapsed_time": "rejected: patched torch.cuda.Event.elapsed_time",
    # The allocator hands back the NaN the evaluator poisoned it with (should it pick other memory, that holds no
    # right answer for these fresh inputs: the comparison fails instead).
    "cheat_uninitialised": ("rejected: output 0 has NaN or Inf", "incorrect:"),
    "cheat_wrong_shape": "rejected: output 0 is torch.float32 (64, 127), the reference's is torch.float32 (64, 128)",
    "cheat_wrong_dtype": "rejected: output 0 is torch.float16",
    "cheat_sleep_forever": "timed out after 10 s",
    "cheat_exit": "worker process died (exit code 0)",
    "cheat_segfault": "worker process died (killed by SIGSEGV)",
}


@pytest.fixture(scope="module")
def relu_results() -> dict[str, Result]:
    cands = [candidate(name) for name in ["honest_relu", *RELU_CHEATS]]
    return by_name(evaluate(PROBLEMS / "relu.py", cands, device="cpu", timeout_s=10, parallel=4))


def test_eager_and_an_honest_candidate_pass_with_times(relu_results: dict[str, Result]) -> None:
    assert list(relu_results)[:2] == ["eager", "file:honest_relu"]  # eager always first
    for name in ("eager", "file:honest_relu"):
        r = relu_results[name]
        assert r.compiled and r.sound and r.correct, r
        assert r.error == ""
        assert r.max_abs_err == 0.0 and r.rel_norm_err == 0.0
        assert r.runs == 20 and r.median_ms is not None and r.median_ms > r.speed_of_light_ms > 0


@pytest.mark.parametrize("cheat", list(RELU_CHEATS))
def test_cheat_is_rejected(relu_results: dict[str, Result], cheat: str) -> None:
    r = relu_results[f"file:{cheat}"]
    assert not r.correct
    assert not r.correct_under(1.0, 1.0)  # no tolerance, however loose, lets it through
    expected = RELU_CHEATS[cheat]
    assert any(e in r.error for e in ((expected,) if isinstance(expected, str) else expected)), r.error
    assert "\n" not in r.error


def test_a_crash_or_hang_fails_only_that_candidate(relu_results: dict[str, Result]) -> None:
    for name in ("cheat_exit", "cheat_segfault", "cheat_sleep_forever"):
        assert relu_results[f"file:{name}"].compiled  # it was running when it died
    assert relu_results["file:honest_relu"].correct


def test_zeros_pass_an_absolute_tolerance_but_not_the_relative_norm() -> None:
    results = by_name(evaluate(PROBLEMS / "tiny_scale.py", [candidate("cheat_zeros")], device="cpu"))
    zeros = results["file:cheat_zeros"]
    assert zeros.sound and zeros.max_abs_err < 1e-4 and zeros.max_scaled_err <= 1  # elementwise within tolerance
    assert zeros.rel_norm_err == pytest.approx(1.0)
    assert not zeros.correct and zeros.error.startswith("incorrect: relative norm error 1")
    assert results["eager"].correct


def test_memoised_answers_are_faster_than_the_speed_of_light() -> None:
    # The memo passes every correctness check (it computes each new input once) but its timed runs do no GEMM.
    results = by_name(evaluate(PROBLEMS / "matmul.py", [candidate("cheat_memo")], device="cpu", runs=20))
    memo = results["file:cheat_memo"]
    assert memo.compiled and memo.max_abs_err < 1e-3  # right answers ...
    assert not memo.sound and not memo.correct
    assert memo.error.startswith("rejected: faster than the speed of light")
    assert memo.median_ms is not None and memo.speed_of_light_ms is not None
    assert memo.median_ms < memo.speed_of_light_ms
    assert results["eager"].correct and results["eager"].median_ms > results["eager"].speed_of_light_ms


def test_an_unknown_transform_fails_alone_and_same_layers_get_the_same_weights() -> None:
    # torch.compile itself is exercised end to end by tests/e2e/test_kernels_cli.py.
    results = by_name(evaluate(PROBLEMS / "linear_gelu.py",
                               [Candidate("nonsense", transform="no-such-transform"), candidate("honest_linear_gelu"),
                                candidate("cheat_zero_reference")], device="cpu", seeds=(11, 12, 13), parallel=2))
    assert list(results) == ["eager", "nonsense", "file:honest_linear_gelu", "file:cheat_zero_reference"]
    zeroed = results["file:cheat_zero_reference"]
    assert not zeroed.correct and zeroed.error == "rejected: modified the reference model's parameters or buffers"
    assert results["eager"].correct
    assert "no-such-transform" in results["nonsense"].error and not results["nonsense"].correct
    honest = results["file:honest_linear_gelu"]
    assert honest.correct and 0 < honest.max_abs_err < 1e-5  # same weights (same seed), a different GELU formula


def test_bad_problems_and_candidates_are_user_errors() -> None:
    with pytest.raises(NotFoundError, match="not found"):
        evaluate(PROBLEMS / "missing.py", [], device="cpu")
    with pytest.raises(SpecError, match="defines no Model"):
        evaluate(PROBLEMS / "no_model.py", [], device="cpu")
    with pytest.raises(SpecError, match="defines no class ModelNew"):
        evaluate(PROBLEMS / "relu.py", [candidate("no_model_new")], device="cpu")
    with pytest.raises(UserError, match="exactly one of a file and a transform"):
        evaluate(PROBLEMS / "relu.py", [Candidate("x")], device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA GPU"):
            evaluate(PROBLEMS / "relu.py", [], device="cuda")


def test_a_problem_with_all_zero_inputs_is_refused() -> None:
    with pytest.raises(SpecError, match="all zeros"):
        evaluate(PROBLEMS / "zero_inputs.py", [], device="cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_side_stream_work_is_rejected_on_cuda() -> None:
    results = by_name(evaluate(PROBLEMS / "relu.py", [candidate("cheat_side_stream"), candidate("honest_relu")],
                               device="cuda"))
    side = results["file:cheat_side_stream"]
    assert not side.correct and side.error.startswith("rejected:"), side.error
    assert "stream" in side.error or "NaN" in side.error
    assert results["file:honest_relu"].correct


def result(**changes: object) -> Result:
    base = dict(problem="p", candidate="c", compiled=True, correct=True, max_abs_err=2e-3, rel_norm_err=1e-3,
                max_scaled_err=10.0, median_ms=1.0, runs=20, error="", sound=True, atol=1e-4, rtol=1e-4,
                excess=((0.0, 2e-3), (1e-4, 1.9e-3), (1e-2, 5e-4), (1.0, -1.0)))
    return Result(**{**base, **changes})  # type: ignore[arg-type]


def test_results_are_re_judged_under_another_tolerance_from_the_record() -> None:
    r = result()
    assert not r.correct_under(1e-4, 1e-4)  # 1.9e-3 of excess at rtol 1e-4 > atol 1e-4
    assert r.correct_under(1e-2, 1e-2)  # 5e-4 <= 1e-2, and the relative norm 1e-3 <= 1e-2
    assert r.correct_under(1e-2, 1e-4)  # 1.9e-3 <= 1e-2
    assert r.correct_under(2e-3, 0.0) and not r.correct_under(1.9e-3, 0.0)
    # rtol 1e-3 lies between recorded points: the chord bounds the excess from above (1.77e-3).
    assert not r.correct_under(1e-3, 1e-3) and r.correct_under(1.8e-3, 1e-3)
    assert not result(sound=False).correct_under(1.0, 1.0)
    assert not result(rel_norm_err=0.5).correct_under(1e-2, 1e-2)


def test_excess_between_recorded_rtols_is_bounded_from_above() -> None:
    points = ((0.0, 1.0), (1.0, -1.0))
    assert excess_bound(points, 0.5) == 0.0  # on the chord
    assert excess_bound(points, 2.0) == -1.0  # past the last point: non-increasing
    assert excess_bound((), 0.1) == math.inf


def test_results_round_trip_through_json_with_infinities() -> None:
    r = result(max_abs_err=math.inf, excess=((0.0, math.inf),), median_ms=None)
    data = r.to_dict()
    assert data["max_abs_err"] is None and data["excess"] == [[0.0, None]]
    assert Result.from_dict(data) == r


PRECISION = KERNELS / "precision"


def test_the_eager_baseline_and_fp32_candidates_run_without_tf32_convolutions() -> None:
    # PyTorch lets cuDNN use TF32 by default; the probe doubles its answer when it may, and so is judged correct only
    # where the flag is off. A candidate that declares it lowers precision starts from PyTorch's default.
    probe = PRECISION / "tf32_probe_new.py"
    results = by_name(evaluate(PRECISION / "tf32_probe.py", [
        Candidate(name="fp32", file=probe), Candidate(name="lower", file=probe, lowers_precision=True),
    ], device="cpu", runs=2, timeout_s=60))
    assert results["eager"].correct, results["eager"].error
    assert results["fp32"].correct, results["fp32"].error
    assert not results["lower"].correct and results["lower"].lowers_precision


def test_inductor_compile_pool_threads_are_allowed_and_lookalikes_are_not() -> None:
    import threading
    import time

    from torch._inductor.compile_worker.subproc_pool import SubprocPool
    from torch._inductor.compile_worker.timer import Timer

    from farm_agent.tuner.worker import is_inductor_thread, new_threads, threads_now

    before = threads_now()
    pool = SubprocPool.__new__(SubprocPool)  # no worker process: only its bound quiesce is needed
    inductors = Timer(600, pool.quiesce)  # what SubprocPool builds: its thread is "subproc_worker_timer"
    inductors.record_call()
    user_work = Timer(600, lambda: None)  # Inductor's Timer running someone else's callback
    user_work.record_call()
    impostor = threading.Thread(target=time.sleep, args=(600,), name="subproc_worker_timer", daemon=True)
    impostor.start()
    try:
        assert inductors.background_thread is not None and inductors.background_thread.name == "subproc_worker_timer"
        assert is_inductor_thread(inductors.background_thread)
        assert user_work.background_thread is not None and not is_inductor_thread(user_work.background_thread)
        assert not is_inductor_thread(impostor)
        assert new_threads(before) == ["subproc_worker_timer", "subproc_worker_timer"]  # the two lookalikes
    finally:
        inductors.quit()
        user_work.quit()


def test_a_hanging_candidate_dies_with_an_evaluator_that_was_killed(tmp_path: Path) -> None:
    # As Ray kills a cancelled shard's worker: the fork server would keep the hanging child alive, and it its server.
    import signal
    import subprocess
    import sys

    import psutil

    from farm.local import wait_for

    marker = tmp_path / "hanging.pid"
    hang = tmp_path / "hang.py"
    hang.write_text(
        "import os, time\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        f"        open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "        while True:\n            time.sleep(3600)\n")
    script = tmp_path / "evaluate_hang.py"
    script.write_text("from farm_agent.tuner.evaluator import evaluate, file_candidate\n"
                      f"evaluate({str(PROBLEMS / 'relu.py')!r}, [file_candidate({str(hang)!r})], device='cpu',"
                      " timeout_s=600)\n")
    evaluator = subprocess.Popen([sys.executable, str(script)])
    try:
        assert wait_for(lambda: marker.exists() and marker.read_text() != "", 120, 0.5)
        child = psutil.Process(int(marker.read_text()))
        assert child.is_running()
    finally:
        evaluator.send_signal(signal.SIGKILL)
        evaluator.wait()
    assert wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, 30, 0.5)


def test_inductor_compile_thread_pool_workers_are_allowed_only_while_idle() -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import torch._inductor.config
    from torch._inductor.async_compile import AsyncCompile

    from farm_agent.tuner.worker import is_inductor_thread

    # config.patch, not monkeypatch.setattr: the latter's undo left the option missing for every later
    # torch.compile in the process ("torch._inductor.config.compile_threads does not exist", torch 2.13).
    with torch._inductor.config.patch(compile_threads=2):
        release, started = threading.Event(), threading.Event()
        running: list[threading.Thread] = []

        def held() -> None:  # someone's work on Inductor's own pool, on whichever of its threads takes it
            running.append(threading.current_thread())
            started.set()
            release.wait(60)

        # The pool may be an earlier test's, its threads already started: the one to watch is the one running the
        # work.
        busy = AsyncCompile.pool().submit(held)
        mine = ThreadPoolExecutor(1)
        mine.submit(lambda: None).result()
        try:
            assert started.wait(10)
            worker = running[0]
            assert worker.name.startswith("ThreadPoolExecutor") and worker not in mine._threads
            assert not is_inductor_thread(worker)  # busy: work left running
            release.set()
            busy.result(10)
            from farm.local import wait_for

            assert wait_for(lambda: is_inductor_thread(worker), 10, 0.05)  # idle: allowed
            assert not any(is_inductor_thread(t) for t in mine._threads)  # an idle worker of another pool
        finally:
            release.set()
            mine.shutdown()


def test_an_evaluation_keeps_its_child_and_its_reference_across_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's tuning run on an H100 spent its 20 s budget on its rounds' starts: each evaluator call started a child
    (its CUDA context, the model, the reference's FLOPs) and measured eager again. An Evaluation's rounds share one
    child for its built-in transforms, and eager is measured once; each candidate says what measuring it took."""
    from farm_agent.tuner import evaluator

    started: list[object] = []

    class Counted(evaluator.Child):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            started.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(evaluator, "Child", Counted)
    with evaluator.Evaluation(PROBLEMS / "relu.py", device="cpu", timeout_s=30) as evaluation:
        first = by_name(evaluation.run([Candidate("again", transform="pytorch-defaults")]))
        second = by_name(evaluation.run([Candidate("once-more", transform="pytorch-defaults")]))
        assert evaluation.start_s > 0
    assert list(first) == ["eager", "again"] and list(second) == ["eager", "once-more"]
    assert len(started) == 1
    assert second["eager"] == first["eager"]  # measured once, in the first round
    assert all(r.correct and r.seconds is not None and r.seconds > 0 for r in [*first.values(), *second.values()])
