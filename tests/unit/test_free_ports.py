"""farm.local.free_ports: the ports a head's listeners are given when none are named (tests, `farm demo`)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from farm import local
from farm.local import PICKED_PORTS, free_ports


def test_ports_picked_together_are_distinct_and_free(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A narrow range makes a repeat certain for picks made one by one (CI once gave a head's data and bulk ports
    # the same number); picked together, each is held until all are found.
    monkeypatch.setattr(local, "PICKED_PORTS", range(PICKED_PORTS.start, PICKED_PORTS.start + 100))
    for _ in range(100):
        ports = free_ports(6)
        assert len(set(ports)) == 6
        for port in ports:
            with socket.socket() as sock:
                sock.bind(("0.0.0.0", port))  # free again once returned


def test_ray_s_client_port_is_never_one_the_head_binds_after_ray_starts(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The head picked Ray's client-server port free before binding its own ports: a pick of its gRPC port failed
    its start ("Failed to bind to address", CI)."""
    from farm.head.server import ray_client_port
    from farm.head.settings import HeadSettings

    port, other = free_ports(2)
    settings = HeadSettings(state_dir=tmp_path, port=port)
    monkeypatch.setattr(local, "PICKED_PORTS", [port, other])  # the pick may only name these two
    assert {ray_client_port(settings) for _ in range(20)} == {other}
