"""A training checkpoint is made on a node: the head reads it as safetensors (tensors and numbers only), so a node's
pickle cannot run code inside the head."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from farm.core.models import JobState
from farm.core.spec import parse_spec
from farm.head.kinds.training import Training, checkpoint_path
from farm.head.settings import HeadSettings
from farm.head.store import Store

SPEC = ("name: t\nkind: training\nmodel: toyjob:doubler\ndataset: toyjob:numbers\nbatch_size: 1\n"
        "training: {loss: mse, steps: 2, checkpoint_every: 2}\n")


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.mkdir, (str(self.marker),))  # what a node's pickle could run in the head


def test_a_node_s_checkpoint_cannot_run_code_in_the_head(tmp_path: Path) -> None:
    output = tmp_path / "out"
    marker = tmp_path / "ran"
    store = Store(tmp_path / "state.db")
    store.add_job("j-1", "t", "training", SPEC, "/nowhere/code.zip", str(output), 2, [(0, 2)])
    store.set_job_state("j-1", JobState.RUNNING)
    checkpoint_path(output, 2).parent.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(1)}, "step": 2, "extra": Payload(marker)}, checkpoint_path(output, 2))
    with pytest.raises(Exception, match="deserializing header"):  # a pickle is no safetensors file
        Training(HeadSettings(state_dir=tmp_path)).finish(store.job("j-1"), parse_spec(SPEC), {})
    assert not marker.exists()


def test_a_worker_s_checkpoint_gives_the_final_model(tmp_path: Path) -> None:
    from farm_agent.work.kinds.training import checkpoint_bytes

    output = tmp_path / "out"
    store = Store(tmp_path / "state.db")
    store.add_job("j-1", "t", "training", SPEC, "/nowhere/code.zip", str(output), 2, [(0, 2)])
    model = torch.nn.Linear(2, 1)
    checkpoint_path(output, 2).parent.mkdir(parents=True)
    checkpoint_path(output, 2).write_bytes(checkpoint_bytes(model, torch.optim.SGD(model.parameters(), lr=0.1), 2))
    Training(HeadSettings(state_dir=tmp_path)).finish(store.job("j-1"), parse_spec(SPEC), {})
    final = torch.load(output / "model.pt", weights_only=True)
    assert final.keys() == model.state_dict().keys() and torch.equal(final["weight"], model.weight.detach())
