"""The CUDA backend's offers on recorded nodes, and the daemon-side lightness of the module.

`run` needs an NVIDIA GPU (CI has none): it ran on the lent H200 (docs/h200-run.md). Here its own code runs with the
CPU standing in for the device (CUDA's synchronize made a no-op), which is the test double at this machine's edge.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from farm.core.models import BackendName, Hardware
from farm_agent import backends
from farm_agent.backends import cuda

ROOT = Path(__file__).resolve().parents[2]
NODES = ROOT / "tests" / "fixtures" / "nodes"


def node(name: str) -> Hardware:
    return Hardware.model_validate_json((NODES / f"{name}.json").read_text())


def test_one_offer_per_gpu_of_a_two_gpu_box() -> None:
    offers = cuda.offers(node("h200x2-box"), cpus=32)

    assert [o.device for o in offers] == ["cuda:0", "cuda:1"]
    assert {o.name for o in offers} == {BackendName.CUDA}
    # Each GPU's shards read and decode their batches on its share of the lent CPUs (one thread had an image
    # folder's shards decode at a plain loop's rate beside a GPU).
    assert all(o.available and o.slots == 1 and o.threads == 16 and not o.reason for o in offers)
    assert all(o.detail == "NVIDIA H200, 140 GiB" for o in offers)
    assert [o.threads for o in cuda.offers(node("h200x2-box"), cpus=1)] == [1, 1]


def test_a_cpu_box_offers_no_cuda_at_all() -> None:
    assert cuda.offers(node("laptop-cpu"), cpus=8) == []


def test_the_agent_offers_cuda_beside_cpu() -> None:
    offers = backends.offers(node("h200x2-box"), cpus=32)

    assert [(o.name, o.device) for o in offers] == [
        (BackendName.CUDA, "cuda:0"), (BackendName.CUDA, "cuda:1"), (BackendName.CPU, "cpu"),
    ]
    assert [(o.name, o.device) for o in backends.offers(node("laptop-cpu"), cpus=8)] == [(BackendName.CPU, "cpu")]
    assert backends.load("cuda") is cuda


def test_importing_the_backend_does_not_import_torch() -> None:
    # A fresh interpreter: this test process may have imported torch already for other tests.
    code = (
        "import sys; import farm_agent.backends.cuda, farm_agent.backends; "
        "farm_agent.backends.offers(__import__('farm.core.models', fromlist=['x']).Hardware("
        "hostname='h', os='linux', arch='x86_64', cpu_model='c', cpu_cores=1, memory_bytes=1), 1); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "False"


def test_a_shard_with_no_full_batch_reports_no_winner(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The winner runs full batches only: a shard whose batches were all short (a tail) ran eager and says so, not
    the winner of the shard before it. The tuner stands in for a GPU's (CI has none): the forward's bookkeeping is
    what is checked."""
    import torch

    from farm.core.tasks import Tuning
    from farm.core.tuning import TuningOutcome
    from farm_agent.tuner import tune

    found = TuningOutcome(winner="cuda_graph", reason="cached", tuning_s=4.0)
    monkeypatch.setattr(tune, "tuned_forward", lambda module, *args, **kwargs: (module, found))
    module = torch.nn.Linear(2, 2)
    device = "cpu"  # as a device name only: the bookkeeping is the same for cuda:0
    cuda._tuned_forward(module, torch.ones(8, 2), Tuning(), device)  # a shard's full batches
    assert cuda.take_outcome(module, device) == found
    assert cuda.take_outcome(module, device) is None  # the next shard: a tail of short batches only
    cuda._tuned_forward(module, torch.ones(8, 2), Tuning(), device)  # the one after: full batches, tuning paid
    assert cuda.take_outcome(module, device) == TuningOutcome(winner="cuda_graph", reason="cached", tuning_s=0.0)


def test_a_model_is_moved_to_its_device_once_not_each_batch() -> None:
    """`.to()` walks every parameter (0.53 ms a call for a ResNet-18 on the dev box): once per worker and model,
    whatever the backend (cuda, mps, cpu)."""
    import torch

    from farm_agent.backends.base import placed

    moves: list[str] = []

    class Counted(torch.nn.Linear):
        def to(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            moves.append(str(args[0]))
            return super().to(*args, **kwargs)

    module = Counted(2, 2).train()
    for _ in range(3):  # three batches
        placed(module, "cpu")
    assert moves == ["cpu"] and not module.training


def test_run_with_the_cpu_standing_in_for_the_gpu(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """cuda.run's own code: the model placed once over a shard's batches, the tuned forward looked up for full
    batches and eager for the short last one, the outputs in row order."""
    import numpy as np
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    moves: list[str] = []

    class Counted(torch.nn.Linear):
        def to(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            moves.append(str(args[0]))
            return super().to(*args, **kwargs)

    module = Counted(4, 2)
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    outputs = [cuda.run(module, rows, 4, "cpu", 1) for _ in range(3)]  # three batches of a shard, as its runner calls
    with torch.inference_mode():
        expected = module(torch.from_numpy(rows)).numpy()
    assert all(np.allclose(found, expected, rtol=1e-6) for found in outputs)
    assert moves == ["cpu"]
    assert cuda.take_outcome(module, "cpu") is not None  # its full batches went through the tuner's lookup
