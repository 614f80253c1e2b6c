"""A path on the head's machine. The head reads it from its own disk (planning); a node, which shares no filesystem
with the head, reads it through the head's DataService over the head's TLS channel, with the job's read credential:
a token the head made for this job alone, which reaches only the files of the job's dataset plan (so the job's code,
which sees it, never needs the node's key or certificate)."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import grpc
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from farm.core.errors import DataError

if TYPE_CHECKING:
    import fsspec

    from farm.core.tasks import HeadAccess

BLOCK = 16 * 1024 * 1024  # bytes a node asks the head for at a time (read ahead)
MAX_READ = 64 * 1024 * 1024  # bytes one Read may ask for (the head's DataService holds to it)
MAX_MESSAGE = 16 * 1024 * 1024


def filesystem(location: str, access: HeadAccess | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    if access is None:
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(), os.path.abspath(os.path.expanduser(location))
    return HeadFileSystem(access), ""


@lru_cache(maxsize=4)
def channel(address: str, ca_pem: bytes) -> grpc.Channel:
    """A channel to the head as a Ray worker reaches it (its dataset reads, its shards' uploads): one per head."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    if not ca_pem:  # a head started with --insecure
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca_pem), options=options)


class HeadFileSystem(AbstractFileSystem):
    """The files of one job's dataset on the head, by their paths in its plan ("" when the location is a file)."""

    protocol = "farmhead"
    cachable = False  # one per job's access: never shared through fsspec's instance cache

    def __init__(self, access: HeadAccess, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from farm.proto.v1 import data_pb2_grpc

        self.access = access
        self.stub = data_pb2_grpc.DataServiceStub(channel(access.address, access.ca_pem))
        self.metadata = (("authorization", f"Bearer {access.token}"),)

    def _call(self, path: str, call: Any) -> Any:
        try:
            return call()
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code is grpc.StatusCode.NOT_FOUND:
                raise FileNotFoundError(path) from None
            raise OSError(f"the head's data service: {code.name}: {exc.details()}") from None  # type: ignore[attr-defined]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        from farm.proto.v1 import data_pb2

        reply = self._call(path, lambda: self.stub.Stat(
            data_pb2.DataFileRequest(job_id=self.access.job_id, path=path), metadata=self.metadata, timeout=60))
        return {"name": path, "size": reply.size, "type": "file"}

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        info = self.info(path)
        return [info] if detail else [path]

    def read_range(self, path: str, start: int, end: int) -> bytes:
        from farm.proto.v1 import data_pb2

        request = data_pb2.ReadRequest(job_id=self.access.job_id, path=path, offset=start, length=max(end - start, 0))
        return self._call(path, lambda: b"".join(
            chunk.data for chunk in self.stub.Read(request, metadata=self.metadata, timeout=300)))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        if end is not None:
            return self.read_range(path, start or 0, end)
        # To its end in reads of the most one may ask for, without a Stat first: a folder of images is one call
        # per image. A read shorter than asked for is the file's end.
        parts, offset = [], start or 0
        while True:
            part = self.read_range(path, offset, offset + MAX_READ)
            parts.append(part)
            offset += len(part)
            if len(part) < MAX_READ:
                return b"".join(parts)

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_type: str = "readahead", cache_options: dict[str, Any] | None = None, **kwargs: Any,
              ) -> AbstractBufferedFile:
        if mode != "rb":
            raise DataError("the head's data is read-only")
        return HeadFile(self, path, mode, block_size=block_size or BLOCK, cache_type=cache_type,
                        cache_options=cache_options)


class HeadFile(AbstractBufferedFile):
    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.read_range(self.path, start, end)
