from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UploadPart(_message.Message):
    __slots__ = ("table", "figures", "failure", "file")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    table: bytes
    figures: ShardFigures
    failure: ShardFailure
    file: bytes
    def __init__(self, table: _Optional[bytes] = ..., figures: _Optional[_Union[ShardFigures, _Mapping]] = ..., failure: _Optional[_Union[ShardFailure, _Mapping]] = ..., file: _Optional[bytes] = ...) -> None: ...

class Energy(_message.Message):
    __slots__ = ("joules", "seconds", "source", "scope")
    JOULES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    joules: float
    seconds: float
    source: str
    scope: str
    def __init__(self, joules: _Optional[float] = ..., seconds: _Optional[float] = ..., source: _Optional[str] = ..., scope: _Optional[str] = ...) -> None: ...

class ShardFigures(_message.Message):
    __slots__ = ("items", "seconds", "correct", "energy", "peak_memory_bytes", "log", "metrics", "tuning")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TUNING_FIELD_NUMBER: _ClassVar[int]
    items: int
    seconds: float
    correct: int
    energy: Energy
    peak_memory_bytes: int
    log: str
    metrics: _containers.ScalarMap[str, float]
    tuning: TuningOutcome
    def __init__(self, items: _Optional[int] = ..., seconds: _Optional[float] = ..., correct: _Optional[int] = ..., energy: _Optional[_Union[Energy, _Mapping]] = ..., peak_memory_bytes: _Optional[int] = ..., log: _Optional[str] = ..., metrics: _Optional[_Mapping[str, float]] = ..., tuning: _Optional[_Union[TuningOutcome, _Mapping]] = ...) -> None: ...

class TuningOutcome(_message.Message):
    __slots__ = ("winner", "params", "reason", "tuning_s", "tuning_j", "device_name", "driver", "torch_version", "input_shapes", "candidates")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ParamValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ParamValue, _Mapping]] = ...) -> None: ...
    WINNER_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TUNING_S_FIELD_NUMBER: _ClassVar[int]
    TUNING_J_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    TORCH_VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    winner: str
    params: _containers.MessageMap[str, ParamValue]
    reason: str
    tuning_s: float
    tuning_j: float
    device_name: str
    driver: str
    torch_version: str
    input_shapes: _containers.RepeatedScalarFieldContainer[str]
    candidates: _containers.RepeatedCompositeFieldContainer[CandidateFigures]
    def __init__(self, winner: _Optional[str] = ..., params: _Optional[_Mapping[str, ParamValue]] = ..., reason: _Optional[str] = ..., tuning_s: _Optional[float] = ..., tuning_j: _Optional[float] = ..., device_name: _Optional[str] = ..., driver: _Optional[str] = ..., torch_version: _Optional[str] = ..., input_shapes: _Optional[_Iterable[str]] = ..., candidates: _Optional[_Iterable[_Union[CandidateFigures, _Mapping]]] = ...) -> None: ...

class CandidateFigures(_message.Message):
    __slots__ = ("name", "ms", "joules", "note", "seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    JOULES_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ms: float
    joules: float
    note: str
    seconds: float
    def __init__(self, name: _Optional[str] = ..., ms: _Optional[float] = ..., joules: _Optional[float] = ..., note: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class ParamValue(_message.Message):
    __slots__ = ("text", "integer", "number", "flag")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    text: str
    integer: int
    number: float
    flag: bool
    def __init__(self, text: _Optional[str] = ..., integer: _Optional[int] = ..., number: _Optional[float] = ..., flag: _Optional[bool] = ...) -> None: ...

class ShardFailure(_message.Message):
    __slots__ = ("kind", "message", "traceback", "log", "bad_start", "bad_stop", "farm_traceback")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        JOB: _ClassVar[ShardFailure.Kind]
        DATA: _ClassVar[ShardFailure.Kind]
        NODE: _ClassVar[ShardFailure.Kind]
    JOB: ShardFailure.Kind
    DATA: ShardFailure.Kind
    NODE: ShardFailure.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    BAD_START_FIELD_NUMBER: _ClassVar[int]
    BAD_STOP_FIELD_NUMBER: _ClassVar[int]
    FARM_TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    kind: ShardFailure.Kind
    message: str
    traceback: str
    log: str
    bad_start: int
    bad_stop: int
    farm_traceback: str
    def __init__(self, kind: _Optional[_Union[ShardFailure.Kind, str]] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ..., log: _Optional[str] = ..., bad_start: _Optional[int] = ..., bad_stop: _Optional[int] = ..., farm_traceback: _Optional[str] = ...) -> None: ...

class UploadReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
