"""A head whose start fails part-way (its dashboard's port taken in the moment between the pick and the bind) stops
what had started: its gRPC port is free again and nothing is left for the collector to find on a closed loop. Left
running, the gRPC server raised "Event loop is closed" when collected, and that line, not the reason, was what
`farm head start --detach` showed (CI, stop 36)."""

from __future__ import annotations

import gc
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from farm.core.errors import UserError
from farm.head.auth import Tokens
from farm.head.server import _serve, run_loop
from farm.head.settings import HeadSettings
from farm.local import free_ports


class TakenPort:
    """A service (as the dashboard is) that cannot listen."""

    async def start(self, *parts: Any) -> dict[str, str]:
        raise UserError("the dashboard cannot listen on 127.0.0.1:1: Address already in use")

    async def stop(self) -> None:
        raise AssertionError("never started, so never stopped")


def test_a_failed_start_stops_what_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = dict(zip(("port", "mtls_port", "data_port", "bulk_port"), free_ports(4), strict=True))
    settings = HeadSettings(state_dir=tmp_path, host="127.0.0.1", data_lanes=1, **ports)
    tokens = Tokens.load_or_create(tmp_path, settings.ray_token_path)
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: unraisable.append(repr(info.exc_value)))

    with pytest.raises(UserError, match="dashboard cannot listen"):
        run_loop(_serve(settings, tokens, lambda join: None, [TakenPort()]))
    gc.collect()

    assert not unraisable
    assert not settings.info_path.exists()  # never ready, so never announced
    for port in ports.values():  # each listener closed: a head started again may have them
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
