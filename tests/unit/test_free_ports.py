"""farm.local.free_ports: the ports a head's listeners are given when none are named (tests, `farm demo`)."""

from __future__ import annotations

import socket

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
