from farm.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Node(_message.Message):
    __slots__ = ("id", "name", "state", "hardware", "backends", "ray_node_id", "last_heartbeat", "cpu_percent", "memory_percent", "address", "registered_at", "power", "busy", "drain", "shards_running", "farm_cpu_percent", "gpu_memory", "trusted")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    RAY_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    SHARDS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    FARM_CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_FIELD_NUMBER: _ClassVar[int]
    TRUSTED_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    state: str
    hardware: _common_pb2.Hardware
    backends: _containers.RepeatedCompositeFieldContainer[_common_pb2.Backend]
    ray_node_id: str
    last_heartbeat: float
    cpu_percent: float
    memory_percent: float
    address: str
    registered_at: float
    power: _containers.RepeatedCompositeFieldContainer[_common_pb2.DevicePower]
    busy: str
    drain: bool
    shards_running: int
    farm_cpu_percent: float
    gpu_memory: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuMemory]
    trusted: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., backends: _Optional[_Iterable[_Union[_common_pb2.Backend, _Mapping]]] = ..., ray_node_id: _Optional[str] = ..., last_heartbeat: _Optional[float] = ..., cpu_percent: _Optional[float] = ..., memory_percent: _Optional[float] = ..., address: _Optional[str] = ..., registered_at: _Optional[float] = ..., power: _Optional[_Iterable[_Union[_common_pb2.DevicePower, _Mapping]]] = ..., busy: _Optional[str] = ..., drain: _Optional[bool] = ..., shards_running: _Optional[int] = ..., farm_cpu_percent: _Optional[float] = ..., gpu_memory: _Optional[_Iterable[_Union[_common_pb2.GpuMemory, _Mapping]]] = ..., trusted: _Optional[bool] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesReply(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node", "drain")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    node: str
    drain: bool
    def __init__(self, node: _Optional[str] = ..., drain: _Optional[bool] = ...) -> None: ...
