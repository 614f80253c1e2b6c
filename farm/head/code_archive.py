"""A job's zipped code, checked before anything reads it: a zip's own limit is on its compressed size, and deflate
packs a gigabyte of zeros into a megabyte (a 1.5 MiB zip once took the head to 3.2 GB and an agent's /tmp to 1.6 GB).
What each member and the whole unpack to is bounded by the sizes the archive declares, which is what Python's zipfile
(the head's, and Ray's when a node unpacks the code) writes at most: more, and it fails the member's CRC."""

from __future__ import annotations

import io
import zipfile

from farm.core.errors import SpecError

MAX_MEMBERS = 20_000


def names(code_zip: bytes, max_unzipped_mb: int) -> frozenset[str]:
    """The archive's member names, once its count and unpacked sizes are within bounds."""
    limit = max_unzipped_mb * 1024 * 1024
    try:
        with zipfile.ZipFile(io.BytesIO(code_zip)) as archive:
            members = archive.infolist()
    except zipfile.BadZipFile:
        raise SpecError("the job's code is not a zip archive") from None
    if len(members) > MAX_MEMBERS:
        raise SpecError(f"the job's code has {len(members)} files: at most {MAX_MEMBERS}")
    if sum(m.file_size for m in members) > limit:
        biggest = max(members, key=lambda m: m.file_size)
        raise SpecError(f"the job's code unzips to over {max_unzipped_mb} MB (its biggest file, {biggest.filename!r}, "
                        f"to {biggest.file_size // (1024 * 1024)} MB)")
    return frozenset(m.filename for m in members)
