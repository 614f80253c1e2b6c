"""An S3-compatible bucket: s3://bucket/key or s3://bucket/prefix/ (s3fs). Credentials and the endpoint come from the
environment of the process that reads (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_PROFILE...),
never from the spec or a record: a node reading a bucket needs them in its own environment, the head for planning
and for writing results there."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import fsspec

    from farm.core.tasks import HeadAccess


def filesystem(location: str, access: HeadAccess | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    import s3fs

    # Listings are not cached: a results prefix gains files while a job runs.
    return s3fs.S3FileSystem(use_listings_cache=False), location.removeprefix("s3://").rstrip("/")
