"""Servers the tests start on 127.0.0.1 for the data plane's remote locations: a web server answering ranged GETs, as
every real one does, and moto's S3 server: a stand-in for a real bucket (AWS, MinIO, R2), reached through the same
s3fs client, with credentials and the endpoint only in the environment, as Farm expects them."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Python's file server, plus the Range requests a ranged reader sends (as every real web server answers)."""

    ranges: list[str] = []

    def send_head(self):  # type: ignore[no-untyped-def]
        wanted = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not wanted or not path.is_file():
            return super().send_head()
        self.ranges.append(wanted)
        size = path.stat().st_size
        first, _, last = wanted.removeprefix("bytes=").partition("-")
        start, end = int(first), min(int(last) if last else size - 1, size - 1)
        handle = path.open("rb")
        handle.seek(start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return _Limited(handle, end - start + 1)

    def log_message(self, *args: object) -> None:
        pass


class _Limited:
    def __init__(self, handle, left: int) -> None:  # type: ignore[no-untyped-def]
        self.handle, self.left = handle, left

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.handle.read(size)
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.handle.close()


@contextlib.contextmanager
def serve_http(folder: Path) -> Iterator[str]:
    """`folder` served over HTTP; its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def serve_s3() -> Iterator[str]:
    """moto's S3 server, in this process; its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_environment(endpoint: str) -> dict[str, str]:
    """What a process reading or writing the loopback bucket has in its environment."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint}


def new_bucket() -> str:
    """A fresh bucket on the server the environment names."""
    import boto3

    name = f"farm-{np.random.default_rng().integers(1 << 30)}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name
