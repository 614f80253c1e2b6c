from __future__ import annotations

import pytest

from farm.core.energy import EnergyBasis
from farm.scheduler.calibration import RECENT, Sample, rates


def sample(items: int, seconds: float, joules: float = 0.0, source: str = "", node: str = "n", device: str = "cpu"
           ) -> Sample:
    return Sample(node_id=node, device=device, items=items, seconds=seconds, energy_j=joules, energy_source=source)


def test_rates_pool_every_sample_of_a_device() -> None:
    found = rates([sample(100, 1.0, 10.0, "counter"), sample(300, 2.0, 20.0, "counter"),
                   sample(50, 0.5, node="m")])
    assert found[("n", "cpu")].items_per_s == pytest.approx(400 / 3.0)
    assert found[("n", "cpu")].items_per_j == pytest.approx(400 / 30.0)
    assert (found[("n", "cpu")].energy_source, found[("n", "cpu")].samples) == ("counter", 2)
    assert found[("m", "cpu")].items_per_j is None  # no energy measured there


def test_unlike_energy_sources_give_no_energy_rate() -> None:
    found = rates([sample(100, 1.0, 10.0, "counter"), sample(100, 1.0, 12.0, "model-estimate")])
    assert found[("n", "cpu")].items_per_j is None and found[("n", "cpu")].items_per_s == pytest.approx(100)


def test_empty_samples_give_no_rate() -> None:
    assert rates([sample(0, 0.0)]) == {}


def test_only_the_latest_shards_count_so_a_changed_device_converges() -> None:
    slow = [Sample(node_id="n", device="cpu", items=100, seconds=10.0, finished_at=t) for t in range(1, 9)]
    fast = [Sample(node_id="n", device="cpu", items=100, seconds=1.0, finished_at=t) for t in range(100, 100 + RECENT)]
    found = rates(slow + fast)[("n", "cpu")]
    assert found.items_per_s == pytest.approx(100)  # the slow past no longer counts
    assert (found.samples, found.measured_at) == (RECENT, 100 + RECENT - 1)


def test_the_marginal_basis_ranks_by_energy_above_idle_and_falls_back_to_total() -> None:
    both = [Sample(node_id="n", device="cuda:0", items=1000, seconds=3.0, energy_j=2040.0, energy_source="counter",
                   marginal_j=1665.0)]
    assert rates(both)[("n", "cuda:0")].items_per_j == pytest.approx(1000 / 1665.0)
    assert rates(both)[("n", "cuda:0")].energy_basis == "marginal"
    total = rates(both, basis=EnergyBasis.TOTAL)[("n", "cuda:0")]
    assert (total.items_per_j, total.energy_basis) == (pytest.approx(1000 / 2040.0), "total")
    no_idle = [both[0].model_copy(update={"marginal_j": None})]
    assert rates(no_idle)[("n", "cuda:0")].energy_basis == "total"  # no idle draw read there: its total stands in
