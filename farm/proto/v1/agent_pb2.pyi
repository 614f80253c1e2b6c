from farm.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("join_token", "name", "hardware", "backends", "agent_version", "address", "node_id", "csr_pem", "node_token", "admin_token")
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ADMIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    join_token: str
    name: str
    hardware: _common_pb2.Hardware
    backends: _containers.RepeatedCompositeFieldContainer[_common_pb2.Backend]
    agent_version: str
    address: str
    node_id: str
    csr_pem: bytes
    node_token: str
    admin_token: str
    def __init__(self, join_token: _Optional[str] = ..., name: _Optional[str] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., backends: _Optional[_Iterable[_Union[_common_pb2.Backend, _Mapping]]] = ..., agent_version: _Optional[str] = ..., address: _Optional[str] = ..., node_id: _Optional[str] = ..., csr_pem: _Optional[bytes] = ..., node_token: _Optional[str] = ..., admin_token: _Optional[str] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("node_id", "node_token", "ray_address", "ray_token", "heartbeat_interval_s", "client_cert_pem", "mtls_port")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RAY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RAY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    MTLS_PORT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_token: str
    ray_address: str
    ray_token: str
    heartbeat_interval_s: float
    client_cert_pem: bytes
    mtls_port: int
    def __init__(self, node_id: _Optional[str] = ..., node_token: _Optional[str] = ..., ray_address: _Optional[str] = ..., ray_token: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., client_cert_pem: _Optional[bytes] = ..., mtls_port: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "node_token", "cpu_percent", "memory_percent", "ray_running", "power", "busy", "farm_cpu_percent", "gpu_memory")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RAY_RUNNING_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    FARM_CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_token: str
    cpu_percent: float
    memory_percent: float
    ray_running: bool
    power: _containers.RepeatedCompositeFieldContainer[_common_pb2.DevicePower]
    busy: str
    farm_cpu_percent: float
    gpu_memory: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuMemory]
    def __init__(self, node_id: _Optional[str] = ..., node_token: _Optional[str] = ..., cpu_percent: _Optional[float] = ..., memory_percent: _Optional[float] = ..., ray_running: _Optional[bool] = ..., power: _Optional[_Iterable[_Union[_common_pb2.DevicePower, _Mapping]]] = ..., busy: _Optional[str] = ..., farm_cpu_percent: _Optional[float] = ..., gpu_memory: _Optional[_Iterable[_Union[_common_pb2.GpuMemory, _Mapping]]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    def __init__(self, state: _Optional[str] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("node_id", "node_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_token: str
    def __init__(self, node_id: _Optional[str] = ..., node_token: _Optional[str] = ...) -> None: ...

class DeregisterReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkReport(_message.Message):
    __slots__ = ("hello", "ack", "ended", "worker", "output")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    hello: WorkHello
    ack: WorkAck
    ended: WorkEnded
    worker: WorkerStarted
    output: WorkOutput
    def __init__(self, hello: _Optional[_Union[WorkHello, _Mapping]] = ..., ack: _Optional[_Union[WorkAck, _Mapping]] = ..., ended: _Optional[_Union[WorkEnded, _Mapping]] = ..., worker: _Optional[_Union[WorkerStarted, _Mapping]] = ..., output: _Optional[_Union[WorkOutput, _Mapping]] = ...) -> None: ...

class WorkOutput(_message.Message):
    __slots__ = ("ticket", "text")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ticket: str
    text: str
    def __init__(self, ticket: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class WorkHello(_message.Message):
    __slots__ = ("node_id", "node_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_token: str
    def __init__(self, node_id: _Optional[str] = ..., node_token: _Optional[str] = ...) -> None: ...

class WorkAck(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: str
    def __init__(self, ticket: _Optional[str] = ...) -> None: ...

class WorkEnded(_message.Message):
    __slots__ = ("ticket", "reason", "overhead_s", "device")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ticket: str
    reason: str
    overhead_s: float
    device: str
    def __init__(self, ticket: _Optional[str] = ..., reason: _Optional[str] = ..., overhead_s: _Optional[float] = ..., device: _Optional[str] = ...) -> None: ...

class WorkerStarted(_message.Message):
    __slots__ = ("job_id", "device", "pid", "warm")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WARM_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    device: str
    pid: int
    warm: bool
    def __init__(self, job_id: _Optional[str] = ..., device: _Optional[str] = ..., pid: _Optional[int] = ..., warm: _Optional[bool] = ...) -> None: ...

class WorkOrder(_message.Message):
    __slots__ = ("assign", "cancel")
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    assign: Assignment
    cancel: CancelWork
    def __init__(self, assign: _Optional[_Union[Assignment, _Mapping]] = ..., cancel: _Optional[_Union[CancelWork, _Mapping]] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("ticket", "job_id", "shard", "entry", "device", "task_json", "code_sha256", "env", "result_address", "ca_pem", "name", "run")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TICKET_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    CODE_SHA256_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RESULT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ticket: str
    job_id: str
    shard: int
    entry: str
    device: str
    task_json: bytes
    code_sha256: str
    env: _containers.ScalarMap[str, str]
    result_address: str
    ca_pem: bytes
    name: str
    run: int
    def __init__(self, ticket: _Optional[str] = ..., job_id: _Optional[str] = ..., shard: _Optional[int] = ..., entry: _Optional[str] = ..., device: _Optional[str] = ..., task_json: _Optional[bytes] = ..., code_sha256: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., result_address: _Optional[str] = ..., ca_pem: _Optional[bytes] = ..., name: _Optional[str] = ..., run: _Optional[int] = ...) -> None: ...

class CancelWork(_message.Message):
    __slots__ = ("job_id", "ticket", "run")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    ticket: str
    run: int
    def __init__(self, job_id: _Optional[str] = ..., ticket: _Optional[str] = ..., run: _Optional[int] = ...) -> None: ...

class CodeRequest(_message.Message):
    __slots__ = ("node_id", "node_token", "job_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_token: str
    job_id: str
    def __init__(self, node_id: _Optional[str] = ..., node_token: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class CodePart(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...
