"""Finding 7: a zip member that declares 1 KiB and inflates to far more passed the size check and was inflated whole."""

from __future__ import annotations

import io
import struct
import zipfile

import pytest

from farm.core.errors import SpecError
from farm.head import code_archive


def lying_zip(declared: int, actual: int) -> bytes:
    """A zip of one member whose headers say `declared` bytes while its data inflates to `actual`."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("main.py", b"\0" * actual)
    data = bytearray(buffer.getvalue())
    local = data.index(b"PK\x03\x04")
    central = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, local + 22, declared)  # the local header's uncompressed size
    struct.pack_into("<I", data, central + 24, declared)  # the central directory's
    return bytes(data)


def test_a_member_that_inflates_past_what_it_declares_is_refused_in_one_line() -> None:
    archive = lying_zip(declared=1024, actual=5 * 1024 * 1024)
    with pytest.raises(SpecError) as refused:
        code_archive.names(archive, max_unzipped_mb=1)
    assert "\n" not in refused.value.message


def test_an_honest_archive_passes() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("main.py", b"print(1)\n" * 1000)
    assert code_archive.names(buffer.getvalue(), max_unzipped_mb=1) == {"main.py"}
