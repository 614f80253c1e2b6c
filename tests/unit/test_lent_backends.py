"""`farm agent start --backends`: an owner lends only some of the machine's backends."""

from __future__ import annotations

from pathlib import Path

from farm.core.models import BackendName, BackendOffer
from farm_agent.daemon.main import lent_offers
from tests.conftest import farm

OFFERS = [
    BackendOffer(name=BackendName.CUDA, device="cuda:0"),
    BackendOffer(name=BackendName.CPU, device="cpu"),
    BackendOffer(name=BackendName.MPS, device="mps", available=False, reason="not a Mac"),
]


def test_every_offer_is_lent_by_default() -> None:
    assert lent_offers(OFFERS, None) == OFFERS


def test_offers_not_lent_stay_listed_but_unavailable_with_the_reason() -> None:
    lent = {o.name: o for o in lent_offers(OFFERS, frozenset({BackendName.CPU}))}
    assert lent[BackendName.CPU].available
    assert not lent[BackendName.CUDA].available
    assert "--backends" in lent[BackendName.CUDA].reason
    assert lent[BackendName.MPS].reason == "not a Mac"  # unavailable for its own reason, which is kept


def test_an_unknown_backend_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = farm("agent", "start", "--head", "127.0.0.1:1", "--token", "t", "--backends", "cuda,tpu",
                  "--state-dir", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --backends 'cuda,tpu': expected a comma-separated list of cuda, ane, mps, cpu"]
