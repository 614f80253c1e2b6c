from __future__ import annotations

import pytest

from farm.core.errors import SpecError
from farm.core.models import BackendName, BackendOffer, Hardware, Node, NodeState
from farm.core.spec import Policy, parse_spec
from farm.scheduler import Rate, ShardRequest
from farm.scheduler.training import NoWorkers, batch_shares, choose_workers

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="c", cpu_cores=8, memory_bytes=2**34)
CPU = BackendOffer(name=BackendName.CPU, device="cpu", threads=4)
GPU = BackendOffer(name=BackendName.CUDA, device="cuda:0")


def node(node_id: str, *offers: BackendOffer, state: NodeState = NodeState.READY) -> Node:
    return Node(id=node_id, name=node_id, state=state, hardware=HW, backends=offers)


def request(backends: tuple[BackendName, ...] = tuple(BackendName)) -> ShardRequest:
    return ShardRequest(job_id="j", index=0, items=64, backends=backends, policy=Policy.THROUGHPUT)


@pytest.mark.parametrize("batch, speeds", [(64, [1.0, 1.0]), (64, [4.0, 1.0]), (10, [3.0, 3.0, 3.0]),
                                           (7, [1000.0, 1.0, 1.0]), (5, [0.0, 0.0])])
def test_shares_sum_to_the_global_batch_and_follow_speed(batch: int, speeds: list[float]) -> None:
    shares = batch_shares(batch, speeds)
    assert sum(shares) == batch and min(shares) >= 1
    fastest, slowest = speeds.index(max(speeds)), speeds.index(min(speeds))
    assert shares[fastest] >= shares[slowest]


def test_a_four_times_faster_worker_takes_four_fifths_of_the_batch() -> None:
    assert batch_shares(64, [400.0, 100.0]) == [51, 13]


def test_a_batch_smaller_than_the_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot give 3 workers"):
        batch_shares(2, [1.0, 1.0, 1.0])


def test_workers_are_the_best_devices_by_measurement_then_prior() -> None:
    fleet = [node("a", CPU), node("b", CPU, GPU), node("c", CPU, state=NodeState.OFFLINE)]
    rates = {("a", "cpu"): Rate(items_per_s=5000.0, samples=1)}  # measured: faster than b's CPU prior
    chosen = choose_workers(request(), fleet, 2, rates)
    assert [(w.node_id, w.device) for w in chosen] == [("a", "cpu"), ("b", "cuda:0")]
    assert [(w.node_id, w.device) for w in choose_workers(request((BackendName.CPU,)), fleet, 5)] == [
        ("a", "cpu"), ("b", "cpu")]  # the offline node is filtered; fewer than asked is fine


def test_no_eligible_device_says_why() -> None:
    with pytest.raises(NoWorkers, match="c/cpu: node is offline"):
        choose_workers(request(), [node("c", CPU, state=NodeState.OFFLINE)], 2)


TRAIN = "name: t\nkind: training\nmodel: m:build\ndataset: d:train\n"


def test_training_spec_needs_its_section_and_one_length() -> None:
    spec = parse_spec(TRAIN + "batch_size: 32\ntraining: {epochs: 2, workers: 3, sync: local-sgd}")
    assert spec.training is not None and spec.training.total_steps(1000, 32) == 62
    for text, problem in [(TRAIN, "needs a 'training' section"),
                          (TRAIN + "training: {steps: 5, epochs: 1}", "exactly one of steps and epochs"),
                          (TRAIN + "training: {steps: 5, loss: huber}", "'huber' is none of"),
                          ("name: t\nmodel: m:b\ndataset: d:x\ntraining: {steps: 5}", "does not go with kind")]:
        with pytest.raises(SpecError, match=problem):
            parse_spec(text)
