"""A job's dataset as the spec names it (where, what format, which columns) and as the head plans it (its files and
how many units each holds). Pure: no I/O; farm.data reads and plans, this only describes.

Units are what a shard's range [start, stop) counts: rows for formats that say how many rows a file holds without
reading it (Parquet's footer, an .npy header, a folder's file list, Arrow files), bytes for line files (JSON Lines,
CSV, text), split at any byte and aligned to line starts when read: a range owns the lines that start inside it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from enum import IntEnum, StrEnum

from pydantic import Field, field_validator, model_validator

from farm.core.frozen import Frozen

CALLABLE_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
COLUMN = re.compile(r"^[^\x00-\x1f]{1,256}$")
ROW_ID = "row_id"  # the results' first column: the row's place in the dataset (a byte offset for line files)


class DataFormat(StrEnum):
    PARQUET = "parquet"  # a file or a folder of files
    JSONL = "jsonl"  # JSON Lines: one object a line
    CSV = "csv"  # a header line, then one row a line (no newlines inside quoted fields)
    TEXT = "text"  # one item a line: column `text`
    IMAGES = "images"  # a folder of PNG/JPEG files: columns `image` (decoded on the node) and `path`
    NPY = "npy"  # one NumPy array, rows along its first axis: column `data`
    HF = "hf"  # a Hugging Face `datasets` folder written by save_to_disk (Arrow files)


class Unit(StrEnum):
    ROWS = "rows"
    BYTES = "bytes"


LINE_FORMATS = (DataFormat.JSONL, DataFormat.CSV, DataFormat.TEXT)
# The columns a format makes itself (the names Ray Data gives them, so code written for either reads the same batch).
FIXED_COLUMNS = {DataFormat.TEXT: ("text",), DataFormat.IMAGES: ("image", "path"), DataFormat.NPY: ("data",)}
SUFFIXES = {".parquet": DataFormat.PARQUET, ".pq": DataFormat.PARQUET, ".jsonl": DataFormat.JSONL,
            ".ndjson": DataFormat.JSONL, ".csv": DataFormat.CSV, ".txt": DataFormat.TEXT, ".npy": DataFormat.NPY}


class Location(StrEnum):
    HEAD = "head"  # a path on the head's machine, served by the head to the nodes (farm.data.locations.head)
    HTTP = "http"  # an http(s):// URL of one file
    S3 = "s3"  # s3://bucket/key or a prefix; credentials from the environment of whoever reads it


class ReadRoute(IntEnum):
    """How a node read a shard's data, as it reports it in the shard's figures (metrics[READ_ROUTE], a number: the
    figures carry numbers only) for `farm job --explain`."""

    HEAD = 0  # through the head's DataService
    DIRECT = 1  # itself: http(s), S3, or a path of the head's that it saw as the head planned it
    FALLBACK = 2  # a path of the head's that it does not see as planned: through the head

    @classmethod
    def of(cls, metrics: Mapping[str, float]) -> ReadRoute | None:
        """The route a shard's figures report; None when they report none (or a number that is none: a node's)."""
        value = metrics.get(READ_ROUTE)
        return cls(int(value)) if value is not None and value in set(cls) else None

    @property
    def text(self) -> str:
        return {ReadRoute.HEAD: "through the head", ReadRoute.DIRECT: "directly",
                ReadRoute.FALLBACK: "through the head (it does not see the path as the head planned it)"}[self]


READ_ROUTE = "read_route"


def location_kind(location: str) -> Location:
    if location.startswith(("http://", "https://")):
        return Location.HTTP
    if location.startswith("s3://"):
        return Location.S3
    return Location.HEAD


class DatasetSpec(Frozen):
    """`dataset:` as a mapping. inputs: the column(s) the model reads (without preprocess, converted to one array of
    numbers per row); passthrough: columns copied to the results; label: a column of class labels (accuracy)."""

    location: str = Field(min_length=1, max_length=4096)
    format: DataFormat | None = None  # from the location's suffix when not given
    inputs: tuple[str, ...] = ()  # default: the format's own column (text, image, data) or the only column
    passthrough: tuple[str, ...] = ()
    label: str | None = None
    # module:callable(batch: dict[str, np.ndarray]) -> the model's inputs for the batch; runs on the node, streamed
    # with the model inside the shard's energy window (farm.data says why)
    preprocess: str | None = None
    # Whether a node may read a path of the head's machine itself where it sees the plan's files at that path as the
    # head planned them (size and modification time): a node on the head's own machine, or one that mounts the same
    # filesystem (NFS, a cluster's Lustre); others read through the head. None (the default) and True: it may (True,
    # as older specs say it); False: every node reads through the head. A node reads nothing this way that its job's
    # code could not open itself.
    shared: bool | None = None

    @field_validator("inputs", "passthrough", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("inputs", "passthrough")
    @classmethod
    def _columns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not COLUMN.match(name) or name == ROW_ID:
                raise ValueError(f"{name!r} is not a column name (1-256 printable characters, not {ROW_ID!r})")
        return tuple(dict.fromkeys(value))

    @field_validator("preprocess")
    @classmethod
    def _preprocess(cls, value: str | None) -> str | None:
        if value is not None and not CALLABLE_PATH.match(value):
            raise ValueError(f"{value!r} is not of the form package.module:callable")
        return value

    @field_validator("location")
    @classmethod
    def _location(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("contains a NUL byte")
        if value.startswith("s3://") and len(value.removeprefix("s3://").strip("/")) == 0:
            raise ValueError("names no bucket")
        if "://" in value and not value.startswith(("http://", "https://", "s3://")):
            raise ValueError(f"{value.split('://')[0]}:// is not a location Farm reads (a path, http(s)://, s3://)")
        return value

    @model_validator(mode="after")
    def _format_known(self) -> DatasetSpec:
        if self.resolved_format is None:
            raise ValueError(f"say the format of {self.location!r}: {', '.join(f.value for f in DataFormat)}")
        if self.where is Location.HTTP and self.resolved_format in (DataFormat.IMAGES, DataFormat.HF):
            raise ValueError(f"an http(s) location is one file; format '{self.resolved_format.value}' is a folder")
        if self.shared is not None and self.where is not Location.HEAD:
            raise ValueError("shared: is for a path; nodes read http(s) and s3 locations themselves always")
        fixed = FIXED_COLUMNS.get(self.resolved_format)
        if fixed and self.inputs and not set(self.inputs) <= set(fixed):
            raise ValueError(f"format '{self.resolved_format.value}' has the columns {', '.join(fixed)}")
        return self

    @property
    def where(self) -> Location:
        return location_kind(self.location)

    @property
    def resolved_format(self) -> DataFormat | None:
        if self.format is not None:
            return self.format
        name = self.location.rstrip("/").rsplit("/", 1)[-1].lower()
        return next((fmt for suffix, fmt in SUFFIXES.items() if name.endswith(suffix)), None)

    @property
    def unit(self) -> Unit:
        return Unit.BYTES if self.resolved_format in LINE_FORMATS else Unit.ROWS

    @property
    def label_columns(self) -> tuple[str, ...]:
        return (self.label,) if self.label else ()


class FileStamp(Frozen):
    """A file of a local dataset as the head saw it when planning: a node compares the file it sees at that path."""

    size: int = Field(ge=0)
    mtime_ns: int


class DataFile(Frozen):
    """One file of a planned dataset: its path under the location (empty: the location is the file) and the units
    [offset, offset + units) it holds in the whole dataset; `stamp`: on a spread of a local dataset's files
    (farm.data.locations.shared)."""

    path: str
    offset: int = Field(ge=0)
    units: int = Field(ge=0)
    stamp: FileStamp | None = None

    @property
    def stop(self) -> int:
        return self.offset + self.units


class DatasetPlan(Frozen):
    """What the head learned of a dataset without reading its data: its files in order, each one's units, its
    columns. A shard's task carries the plan sliced to its range, so a node never lists the dataset."""

    location: str
    format: DataFormat
    unit: Unit
    files: tuple[DataFile, ...]
    rows: int | None = None  # known for row units; line files are counted only as they are read
    columns: tuple[str, ...] = ()
    shared: bool = False  # its files carry stamps: a node that sees them so at their path reads them itself

    @property
    def size(self) -> int:
        """Units in the whole dataset (rows, or bytes of line files)."""
        return self.files[-1].stop if self.files else 0

    def slice(self, start: int, stop: int) -> DatasetPlan:
        """The plan of the files holding units [start, stop) (their offsets unchanged)."""
        stops = [f.stop for f in self.files]
        first = bisect.bisect_right(stops, start)
        chosen = []
        for file in self.files[first:]:
            if file.offset >= stop:
                break
            if file.units:
                chosen.append(file)
        return self.model_copy(update={"files": tuple(chosen)})

    def pieces(self, start: int, stop: int) -> list[tuple[DataFile, int, int]]:
        """(file, first unit, end unit) within each file, for the units [start, stop) of the dataset."""
        return [(f, max(start, f.offset) - f.offset, min(stop, f.stop) - f.offset)
                for f in self.slice(start, stop).files]

    def model_inputs(self, spec: DatasetSpec) -> tuple[str, ...]:
        """The columns the model (or the preprocess) reads: the spec's, else the format's own, else the only one."""
        if spec.inputs:
            return spec.inputs
        fixed = FIXED_COLUMNS.get(self.format)
        if fixed:
            return fixed[:1]
        others = [c for c in self.columns if c not in (*spec.passthrough, *spec.label_columns)]
        return tuple(others[:1]) if len(others) == 1 else ()

    def check_columns(self, spec: DatasetSpec) -> str | None:
        """Why the spec's columns do not fit this dataset, or None."""
        if not self.model_inputs(spec):
            return (f"the dataset has the columns {', '.join(self.columns)}: name the ones the model reads "
                    "(dataset.inputs)")
        if self.columns:
            missing = [c for c in (*self.model_inputs(spec), *spec.passthrough, *spec.label_columns)
                       if c not in self.columns]
            if missing:
                return f"no column {', '.join(map(repr, missing))} in the dataset (it has {', '.join(self.columns)})"
        return None
