"""An http(s):// URL of one file, read with ranged GETs (fsspec's HTTPFileSystem, over aiohttp)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from farm.core.errors import SpecError

if TYPE_CHECKING:
    import fsspec

    from farm.core.tasks import HeadAccess


def filesystem(location: str, access: HeadAccess | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    from fsspec.implementations.http import HTTPFileSystem

    return HTTPFileSystem(), location


def check_ranges(fs: fsspec.AbstractFileSystem, url: str) -> None:
    """Refuse, at plan, a server that does not answer range requests: every format reads a shard's range of the file,
    and fsspec reads past its start only by Range (a server that ignores it sends the whole file from byte 0, and
    fsspec then raises). One GET of the file's last byte asks; its body is never read when the answer is not ranged."""
    from fsspec.implementations.http import HTTPFile

    try:
        with fs.open(url, "rb", cache_type="none") as handle:
            if not isinstance(handle, HTTPFile):  # fsspec streams a file whose size or ranges the server withholds
                raise ValueError("no size or ranges")
            if handle.size > 1:
                handle.seek(handle.size - 1)
                handle.read(1)
    except ValueError:
        raise SpecError(f"dataset {url!r}: its server does not answer range requests (HTTP Range), by which every "
                        "shard reads its part: serve it from one that does (any web server or bucket), or from the "
                        "head's disk") from None
