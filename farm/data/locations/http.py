"""An http(s):// URL of one file, read with ranged GETs (fsspec's HTTPFileSystem, over aiohttp)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import fsspec

    from farm.core.tasks import HeadAccess


def filesystem(location: str, access: HeadAccess | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    from fsspec.implementations.http import HTTPFileSystem

    return HTTPFileSystem(), location
