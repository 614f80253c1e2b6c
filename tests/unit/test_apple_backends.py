"""The ane and mps backends: offers from recorded hardware (any OS), bucketed prediction, compute-plan summaries;
running them needs a Mac (those tests skip elsewhere and say why)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from farm_agent import backends
from farm_agent.backends import ane, mps
from farm_agent.coreml.buckets import DEFAULT_BUCKETS, batches, bucket_for, normalise, pad_to
from farm_agent.coreml.compute_plan import OpPlacement, compute_plan, summarise

from farm.core.models import BackendName, Hardware, Node, NodeState
from farm.scheduler import ShardRequest, place
from tests.conftest import FIXTURES, ROOT

MAC_ONLY = pytest.mark.skipif(sys.platform != "darwin", reason="needs macOS: Core ML's runtime and Metal")


def hardware(name: str) -> Hardware:
    return Hardware.model_validate_json((FIXTURES / "nodes" / f"{name}.json").read_text())


# --- offers ---


def test_an_apple_silicon_mac_offers_the_neural_engine_and_its_gpu() -> None:
    mac = hardware("m2-pro-mac")
    found = {o.name: o for o in backends.offers(mac, 12)}
    assert set(found) == {BackendName.ANE, BackendName.MPS, BackendName.CPU}
    assert (found[BackendName.ANE].device, found[BackendName.ANE].slots, found[BackendName.ANE].available) == (
        "ane", 1, True)
    assert "Apple M2 Pro Neural Engine" in found[BackendName.ANE].detail
    assert (found[BackendName.MPS].device, found[BackendName.MPS].detail) == ("mps", "Apple M2 Pro GPU (Metal)")


@pytest.mark.parametrize("fixture", ["h200-box", "laptop-cpu"])
def test_other_machines_make_no_apple_offer_at_all(fixture: str) -> None:
    # Like CUDA on a CPU box: not an unavailable offer, no offer.
    names = {o.name for o in backends.offers(hardware(fixture), 8)}
    assert BackendName.ANE not in names and BackendName.MPS not in names
    assert ane.offers(hardware(fixture), 8) == [] and mps.offers(hardware(fixture), 8) == []


def test_an_intel_mac_has_no_neural_engine() -> None:
    intel = hardware("m2-pro-mac").model_copy(update={"arch": "x86_64", "apple_chip": "", "cpu_model": "Intel i9"})
    assert ane.offers(intel, 8) == [] and mps.offers(intel, 8) == []


def test_offering_imports_neither_coremltools_nor_torch() -> None:
    # The daemon offers from the hardware fixture as it would on a Mac: the Apple backends stay light.
    code = (
        "import sys\n"
        "from farm.core.models import Hardware\n"
        "from farm_agent import backends\n"
        f"hw = Hardware.model_validate_json(open({str(FIXTURES / 'nodes' / 'm2-pro-mac.json')!r}).read())\n"
        "names = sorted(o.name.value for o in backends.offers(hw, 12))\n"
        "print(names, 'coremltools' in sys.modules, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "agents"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ane', 'cpu', 'mps'] False False"


def test_the_scheduler_places_an_ane_shard_on_the_mac_like_any_backend() -> None:
    mac = Node(id="mac", name="mac", state=NodeState.READY, hardware=hardware("m2-pro-mac"),
               backends=tuple(backends.offers(hardware("m2-pro-mac"), 12)))
    requests = [ShardRequest(job_id="j-1", index=0, items=64, backends=(BackendName.ANE,))]
    (assignment,) = place(requests, [mac]).assignments
    assert (assignment.node_id, assignment.device) == ("mac", "ane")


# --- the compute plan ---


def recorded_plan() -> list[OpPlacement]:
    doc = json.loads((FIXTURES / "apple" / "compute-plan-digits.json").read_text())
    return [OpPlacement(op["op"], op["device"], op["cost"]) for op in doc["ops"]]


def test_the_ane_share_is_weighted_by_estimated_cost_and_constants_do_not_count() -> None:
    plan = summarise(recorded_plan())
    assert plan.ops == 11 and plan.weighted
    assert plan.by_device == {"cpu": 3, "ane": 8}
    assert plan.ane_share == pytest.approx(0.96)
    assert plan.off_ane == {"cast": 2, "reshape": 1}
    assert plan.mostly_ane
    assert plan.describe().startswith("96% of the estimated work on the Neural Engine")


def test_without_costs_ops_are_counted() -> None:
    plan = summarise([OpPlacement("conv", "ane", None), OpPlacement("gather", "cpu", None),
                      OpPlacement("softmax", "gpu", None), OpPlacement("const", "unknown", None)])
    assert (plan.weighted, plan.ops, plan.ane_share) == (False, 3, pytest.approx(1 / 3))
    assert not plan.mostly_ane and "of the ops" in plan.describe()


def test_a_model_mostly_off_the_ane_is_not_offered_for_it() -> None:
    mac = hardware("m2-pro-mac")
    good = ane.model_offer(mac, summarise(recorded_plan()), "digits")
    assert good is not None and good.available and "96% of the estimated work" in good.detail
    cpu_bound = [OpPlacement(p.op, "cpu" if p.op == "conv" else p.device, p.cost) for p in recorded_plan()]
    bad = ane.model_offer(mac, summarise(cpu_bound), "digits")
    assert bad is not None and not bad.available and bad.slots == 0
    assert bad.reason == "only 31% of digits would run on the Neural Engine"
    assert ane.model_offer(hardware("laptop-cpu"), summarise(recorded_plan()), "digits") is None


def test_the_live_compute_plan_is_macos_only_and_says_so(tmp_path: Path) -> None:
    if sys.platform == "darwin":
        pytest.skip("on macOS the compute plan runs: see test_ane_runs_the_digits_model_on_this_mac")
    with pytest.raises(RuntimeError, match="MLComputePlan needs Core ML's runtime"):
        compute_plan(tmp_path / "x.mlpackage", "batch_8")


# --- buckets and bucketed prediction ---


def test_buckets_pad_a_batch_up_to_the_smallest_that_holds_it() -> None:
    assert normalise([64, 1, 8, 8, 32]) == DEFAULT_BUCKETS
    with pytest.raises(ValueError):
        normalise([0, 8])
    assert [bucket_for(n, DEFAULT_BUCKETS) for n in (1, 2, 8, 9, 33, 64)] == [1, 8, 8, 32, 64, 64]
    with pytest.raises(ValueError, match="exceed the largest"):
        bucket_for(65, DEFAULT_BUCKETS)
    # batch_size 100 is cut at the largest bucket; the tail of 12 goes to bucket 32.
    assert list(batches(140, 100, DEFAULT_BUCKETS)) == [(0, 64, 64), (64, 128, 64), (128, 140, 32)]
    padded = pad_to(np.arange(6, dtype=np.float32).reshape(3, 2), 8)
    assert padded.shape == (8, 2) and (padded[3:] == [4, 5]).all()  # copies of the last real item


def test_bucketed_prediction_returns_outputs_in_input_order_without_the_padding() -> None:
    inputs = np.arange(70 * 3, dtype=np.float32).reshape(70, 3)
    calls: list[tuple[int, int]] = []

    def predict(bucket: int, batch: np.ndarray) -> np.ndarray:
        assert len(batch) == bucket  # a static shape per bucket
        calls.append((bucket, len(batch)))
        return batch.sum(axis=1, keepdims=True)

    out = ane.predict_in_buckets(predict, inputs, 30, DEFAULT_BUCKETS)
    assert [c[0] for c in calls] == [32, 32, 32]  # 30 + 30 + 10, each padded up to 32
    np.testing.assert_array_equal(out, inputs.sum(axis=1, keepdims=True))


def test_running_the_ane_backend_off_macos_says_why() -> None:
    if sys.platform == "darwin":
        pytest.skip("on macOS it runs")
    import torch

    with pytest.raises(RuntimeError, match="Core ML, which is macOS only"):
        ane.run(torch.nn.Identity(), np.zeros((2, 3), np.float32), 2, "ane", 1)


# --- on a Mac ---


def digits() -> tuple[object, np.ndarray, np.ndarray]:
    from farm_agent.work.jobcode import build_model

    from examples.digits.data import test_set

    inputs, labels = test_set()
    return build_model("examples.digits.model:build", "examples/digits/weights.pt", ROOT), inputs, labels


@MAC_ONLY
def test_ane_runs_the_digits_model_on_this_mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from farm_agent.coreml.convert import cached_conversion

    monkeypatch.setenv("FARM_STATE_DIR", str(tmp_path))
    module, inputs, labels = digits()
    out = ane.run(module, inputs[:100], 30, "ane", 1)  # 30, 30, 30, 10: buckets 32 and 32 and 32 and 32
    with torch.inference_mode():
        expected = module(torch.from_numpy(inputs[:100])).numpy()
    np.testing.assert_allclose(out, expected, atol=5e-2, rtol=5e-2)  # fp16 on the ANE against fp32
    assert (out.argmax(1) == labels[:100]).mean() > 0.9
    package = cached_conversion(module, inputs[:8]).package
    assert package.path.parent == tmp_path / "coreml"
    plan = compute_plan(package.path, package.default_function)
    assert plan.ops > 0 and 0.0 <= plan.ane_share <= 1.0


@MAC_ONLY
def test_mps_runs_the_digits_model_on_this_mac() -> None:
    import torch

    if not torch.backends.mps.is_available():
        pytest.skip("PyTorch's MPS backend is not available on this Mac")
    module, inputs, _ = digits()
    out = mps.run(module, inputs[:100], 32, "mps", 1)
    with torch.inference_mode():
        expected = module.cpu()(torch.from_numpy(inputs[:100])).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)
