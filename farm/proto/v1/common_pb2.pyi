from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Backend(_message.Message):
    __slots__ = ("name", "device", "detail", "slots", "available", "reason", "threads", "meter_step_s", "idle_w", "idle_source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    METER_STEP_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_W_FIELD_NUMBER: _ClassVar[int]
    IDLE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    device: str
    detail: str
    slots: int
    available: bool
    reason: str
    threads: int
    meter_step_s: float
    idle_w: float
    idle_source: str
    def __init__(self, name: _Optional[str] = ..., device: _Optional[str] = ..., detail: _Optional[str] = ..., slots: _Optional[int] = ..., available: _Optional[bool] = ..., reason: _Optional[str] = ..., threads: _Optional[int] = ..., meter_step_s: _Optional[float] = ..., idle_w: _Optional[float] = ..., idle_source: _Optional[str] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "name", "uuid", "memory_bytes", "driver")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    uuid: str
    memory_bytes: int
    driver: str
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., uuid: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., driver: _Optional[str] = ...) -> None: ...

class Hardware(_message.Message):
    __slots__ = ("hostname", "os", "arch", "cpu_model", "cpu_cores", "memory_bytes", "gpus", "apple_chip")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    CPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    APPLE_CHIP_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    os: str
    arch: str
    cpu_model: str
    cpu_cores: int
    memory_bytes: int
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    apple_chip: str
    def __init__(self, hostname: _Optional[str] = ..., os: _Optional[str] = ..., arch: _Optional[str] = ..., cpu_model: _Optional[str] = ..., cpu_cores: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., apple_chip: _Optional[str] = ...) -> None: ...

class DevicePower(_message.Message):
    __slots__ = ("device", "watts", "source", "scope")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    WATTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    device: str
    watts: float
    source: str
    scope: str
    def __init__(self, device: _Optional[str] = ..., watts: _Optional[float] = ..., source: _Optional[str] = ..., scope: _Optional[str] = ...) -> None: ...

class GpuMemory(_message.Message):
    __slots__ = ("device", "used_bytes", "total_bytes")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    device: str
    used_bytes: int
    total_bytes: int
    def __init__(self, device: _Optional[str] = ..., used_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...
