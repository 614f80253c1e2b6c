from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataFileRequest(_message.Message):
    __slots__ = ("job_id", "path")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    path: str
    def __init__(self, job_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class DataFileInfo(_message.Message):
    __slots__ = ("size",)
    SIZE_FIELD_NUMBER: _ClassVar[int]
    size: int
    def __init__(self, size: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("job_id", "path", "offset", "length")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    path: str
    offset: int
    length: int
    def __init__(self, job_id: _Optional[str] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class ReadFilesRequest(_message.Message):
    __slots__ = ("job_id", "paths")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class FilePart(_message.Message):
    __slots__ = ("index", "data", "last", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    last: bool
    error: str
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class FileParts(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[FilePart]
    def __init__(self, parts: _Optional[_Iterable[_Union[FilePart, _Mapping]]] = ...) -> None: ...

class ListResultsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ResultFile(_message.Message):
    __slots__ = ("name", "size", "shard", "rows")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    shard: int
    rows: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., shard: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class ListResultsReply(_message.Message):
    __slots__ = ("state", "files", "format")
    STATE_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    state: str
    files: _containers.RepeatedCompositeFieldContainer[ResultFile]
    format: str
    def __init__(self, state: _Optional[str] = ..., files: _Optional[_Iterable[_Union[ResultFile, _Mapping]]] = ..., format: _Optional[str] = ...) -> None: ...

class ReadResultRequest(_message.Message):
    __slots__ = ("job_id", "name", "offset")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    offset: int
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...
