"""Code uploads: a job's zipped code arrives in chunks (JobService.UploadCode) before the Submit that names it, so that
the head never takes a large message at once (its receive limit is MAX_MESSAGE) and counts the bytes as they come.
Kept 0600 in the state folder's uploads/, taken (read and removed) by the Submit; one left unclaimed for an hour is
removed at the next upload."""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

from farm.core.errors import NotFoundError, SpecError

MAX_MESSAGE = 4 * 1024 * 1024  # the head's receive limit for any one message
CHUNK = 1024 * 1024  # what a client puts in one CodeChunk
KEEP_S = 3600.0  # an upload no Submit claimed is removed after this
UPLOAD_ID = re.compile(r"^u-[0-9a-f]{32}$")


def folder(state_dir: Path) -> Path:
    path = state_dir / "uploads"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


async def receive(state_dir: Path, chunks: AsyncIterator[bytes], max_bytes: int) -> str:
    """Write the chunks to a new upload, refusing it once it passes `max_bytes`; its id."""
    where = folder(state_dir)
    now = time.time()
    for old in where.iterdir():
        if old.stat().st_mtime < now - KEEP_S:
            old.unlink(missing_ok=True)
    upload_id = "u-" + secrets.token_hex(16)
    part = where / f"{upload_id}.part"
    size = 0
    with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        try:
            async for data in chunks:
                size += len(data)
                if size > max_bytes:
                    raise SpecError(f"the job's code is over {max_bytes // (1024 * 1024)} MB zipped")
                out.write(data)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
    part.rename(where / f"{upload_id}.zip")
    return upload_id


def take(state_dir: Path, upload_id: str) -> bytes:
    """The upload's bytes, removed from the folder (a Submit takes it once)."""
    path = folder(state_dir) / f"{upload_id}.zip"
    if not UPLOAD_ID.match(upload_id) or not path.exists():
        raise NotFoundError(f"no code upload {upload_id!r} (an upload is kept for an hour, for one Submit)")
    data = path.read_bytes()
    path.unlink(missing_ok=True)
    return data
