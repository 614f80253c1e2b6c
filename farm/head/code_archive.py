"""A job's zipped code, checked before anything reads it: a zip's own limit is on its compressed size, and deflate
packs a gigabyte of zeros into a megabyte (a 1.5 MiB zip once took the head to 3.2 GB and an agent's /tmp to 1.6 GB).
The sizes an archive declares may lie (a member declaring 1 KiB that inflates to 1.5 GB): so every member is inflated
here once, in small pieces, its bytes counted against the cap as they come, and its CRC checked. Python's zipfile
(the head's, and Ray's when a node unpacks the code) then writes no more than was checked here."""

from __future__ import annotations

import io
import zipfile
import zlib

from farm.core.errors import SpecError

MAX_MEMBERS = 20_000
PIECE = 1024 * 1024  # bytes inflated at a time: what a lying member can make the head hold


def names(code_zip: bytes, max_unzipped_mb: int) -> frozenset[str]:
    """The archive's member names, once its count and what it inflates to are within bounds (SpecError otherwise).
    Inflates the whole archive: call it off the event loop."""
    limit = max_unzipped_mb * 1024 * 1024
    try:
        with zipfile.ZipFile(io.BytesIO(code_zip)) as archive:
            members = archive.infolist()
            if len(members) > MAX_MEMBERS:
                raise SpecError(f"the job's code has {len(members)} files: at most {MAX_MEMBERS}")
            if sum(m.file_size for m in members) > limit:
                biggest = max(members, key=lambda m: m.file_size)
                raise SpecError(f"the job's code unzips to over {max_unzipped_mb} MB (its biggest file, "
                                f"{biggest.filename!r}, to {biggest.file_size // (1024 * 1024)} MB)")
            total = 0
            for member in members:
                total = _inflate(archive, member, total, limit, max_unzipped_mb)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError) as exc:
        raise SpecError(f"the job's code is not a zip archive Farm can unpack: {exc}") from None
    return frozenset(m.filename for m in members)


def _inflate(archive: zipfile.ZipFile, member: zipfile.ZipInfo, total: int, limit: int, limit_mb: int) -> int:
    """Inflate one member piece by piece; the running total. zipfile stops a member at its declared size and fails
    its CRC when more (or other bytes) follow: BadZipFile, for the caller to word."""
    if member.is_dir():
        return total
    with archive.open(member) as data:
        while piece := data.read(PIECE):
            total += len(piece)
            if total > limit:
                raise SpecError(f"the job's code unzips to over {limit_mb} MB ({member.filename!r} inflates to more "
                                "than it declares)")
    return total
