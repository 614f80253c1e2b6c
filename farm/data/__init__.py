"""The data plane: datasets in (a format × a location, planned into row ranges and streamed batch by batch), results
out (farm.data.results).

Why pyarrow and fsspec rather than Ray Data, which runs on the Ray cluster Farm already has: Ray Data's streaming
executor decides itself where each read and map runs and how big its blocks are, while Farm must run every range on
the device its scheduler chose, inside that device's energy meter, in ranges sized to that device; and a node must
read the head's own files over the head's authenticated channel, which no Ray Data datasource does. So Farm uses the
layers Ray Data itself reads with (pyarrow's dataset, Parquet, IPC and filesystem layers, fsspec), plus its
conventions: the columns `text`, `image`, `path` and `data` are named as Ray Data names them, and a preprocess gets a
batch as Ray Data's `map_batches` does by default (a dict of NumPy arrays).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farm.core.dataset import DatasetPlan, DatasetSpec, Location, ReadRoute, location_kind
from farm.core.errors import SpecError
from farm.data.formats import FORMATS
from farm.data.locations import filesystem, http, is_local, shared

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa

    from farm.core.tasks import HeadAccess


def plan(spec: DatasetSpec, fs: fsspec.AbstractFileSystem | None = None, root: str | None = None) -> DatasetPlan:
    """The dataset's files, their units and its columns, from metadata only (footers, headers, sizes, listings)."""
    fmt = spec.resolved_format
    if fmt is None:  # DatasetSpec refuses one without a format; a copy made without validation may lack it
        raise SpecError(f"dataset {spec.location!r}: say its format")
    if fs is None or root is None:
        fs, root = filesystem(spec.location)
    from pyarrow import ArrowException

    try:
        if not fs.exists(root):
            raise SpecError(f"dataset {spec.location!r}: not found")
        if location_kind(spec.location) is Location.HTTP:
            http.check_ranges(fs, root)
        files, columns, rows = FORMATS[fmt].plan(fs, root)
    except FileNotFoundError:
        raise SpecError(f"dataset {spec.location!r}: not found") from None
    except PermissionError as exc:
        raise SpecError(f"dataset {spec.location!r}: not readable ({exc})") from None
    except (OSError, ArrowException) as exc:  # a file that is not of its format (pyarrow's own errors), a broken read
        raise SpecError(f"dataset {spec.location!r}: does not read as {fmt.value} ({one_line(exc)})") from None
    stamps = shared.stamps(root, [path for path, _ in files]) if spec.shared is not False and is_local(fs) else None
    placed, offset = [], 0
    for i, (path, units) in enumerate(files):
        placed.append({"path": path, "offset": offset, "units": units, "stamp": stamps[i] if stamps else None})
        offset += units
    if offset == 0:
        raise SpecError(f"dataset {spec.location!r} is empty (no {fmt.value} data found)")
    # Validated whole, in one call: a DataFile built (and stamped) a file was most of planning a folder of images
    # (8,192 shared images on the 2-core dev box: 0.07 s, now 0.05).
    result = DatasetPlan.model_validate({"location": spec.location, "format": fmt, "unit": spec.unit,
                                         "files": placed, "rows": rows, "columns": columns,
                                         "shared": stamps is not None})
    problem = result.check_columns(spec)
    if problem:
        raise SpecError(f"dataset {spec.location!r}: {problem}")
    return result


def one_line(exc: BaseException) -> str:
    """An exception's message, its first line only (pyarrow's run to several)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@dataclass(frozen=True)
class Reach:
    """How this machine reads a plan's files: the filesystem and root, the route it takes and, for a shared path read
    through the head after all, why."""

    fs: fsspec.AbstractFileSystem
    root: str
    route: ReadRoute
    why: str = ""


def reach(plan: DatasetPlan, access: HeadAccess | None = None) -> Reach:
    """The way a node reads the plan's files: http(s) and S3 itself (with the credentials in its own environment); a
    path on the head's machine through the head (`access`), unless the plan is stamped and this machine sees the
    files at that path as the head planned them (the head's own machine, a shared filesystem); a path without
    `access` (on the head itself) from the local disk."""
    if access is None or location_kind(plan.location) is not Location.HEAD:
        return Reach(*filesystem(plan.location), ReadRoute.DIRECT)
    if plan.shared:
        local, root = filesystem(plan.location)
        why = shared.mismatch(plan, root)
        if why is None:
            return Reach(local, root, ReadRoute.DIRECT)
        return Reach(*filesystem(plan.location, access), ReadRoute.FALLBACK, why)
    return Reach(*filesystem(plan.location, access), ReadRoute.HEAD)


def read(plan: DatasetPlan, start: int, stop: int, columns: list[str] | None = None, batch_rows: int = 1024,
         access: HeadAccess | None = None, fs: fsspec.AbstractFileSystem | None = None, root: str | None = None,
         workers: int = 1) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the units [start, stop) only (each with `row_id` first, then `columns`, all when
    None), at most `batch_rows` rows each: a reader's memory is a batch (with `workers`, the parts decoding ahead),
    whatever the dataset's size."""
    if fs is None or root is None:
        fs, root = filesystem(plan.location, access)
    return FORMATS[plan.format].read(fs, root, plan.location, plan.pieces(start, stop), columns, batch_rows,
                                     workers)
