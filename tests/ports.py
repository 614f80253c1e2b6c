"""The ports of a head a test starts through the CLI: every one picked free. Left to their defaults, the mTLS, data
and bulk ports are --port + 3, + 4 and + 5, and CI once found + 5 taken by another test's process."""

from __future__ import annotations

from farm.local import free_ports

HEAD_PORT_OPTIONS = ("--port", "--ray-port", "--mtls-port", "--data-port", "--bulk-port")


def head_ports(ray_port: int | None = None, options: tuple[str, ...] = HEAD_PORT_OPTIONS) -> list[str]:
    """`--port P --ray-port R ...`: one free port for each of `options` (Ray's the one given, where the test needs
    to know it)."""
    chosen = {"--ray-port": ray_port} if ray_port else {}
    free = [port for port in free_ports(len(options) + 1) if port != ray_port][:len(options)]
    picked = dict(zip(options, free, strict=True)) | chosen
    return [arg for option in options for arg in (option, str(picked[option]))]
