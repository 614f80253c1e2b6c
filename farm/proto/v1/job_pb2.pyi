from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CodeChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class CodeUpload(_message.Message):
    __slots__ = ("upload_id",)
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    def __init__(self, upload_id: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("spec_yaml", "code_zip", "items", "output", "model_bytes", "code_upload", "overwrite", "dataset_location")
    SPEC_YAML_FIELD_NUMBER: _ClassVar[int]
    CODE_ZIP_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CODE_UPLOAD_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    DATASET_LOCATION_FIELD_NUMBER: _ClassVar[int]
    spec_yaml: str
    code_zip: bytes
    items: int
    output: str
    model_bytes: int
    code_upload: str
    overwrite: bool
    dataset_location: str
    def __init__(self, spec_yaml: _Optional[str] = ..., code_zip: _Optional[bytes] = ..., items: _Optional[int] = ..., output: _Optional[str] = ..., model_bytes: _Optional[int] = ..., code_upload: _Optional[str] = ..., overwrite: _Optional[bool] = ..., dataset_location: _Optional[str] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("index", "state", "node_id", "node_name", "backend", "start", "stop", "items", "seconds", "error", "attempts", "energy_j", "energy_source", "energy_scope", "device", "peak_memory_bytes", "marginal_j", "read_route", "forward", "time", "placed_at", "finished_at")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    ENERGY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    ENERGY_SCOPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MARGINAL_J_FIELD_NUMBER: _ClassVar[int]
    READ_ROUTE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PLACED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    index: int
    state: str
    node_id: str
    node_name: str
    backend: str
    start: int
    stop: int
    items: int
    seconds: float
    error: str
    attempts: int
    energy_j: float
    energy_source: str
    energy_scope: str
    device: str
    peak_memory_bytes: int
    marginal_j: float
    read_route: str
    forward: str
    time: ShardTime
    placed_at: float
    finished_at: float
    def __init__(self, index: _Optional[int] = ..., state: _Optional[str] = ..., node_id: _Optional[str] = ..., node_name: _Optional[str] = ..., backend: _Optional[str] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., items: _Optional[int] = ..., seconds: _Optional[float] = ..., error: _Optional[str] = ..., attempts: _Optional[int] = ..., energy_j: _Optional[float] = ..., energy_source: _Optional[str] = ..., energy_scope: _Optional[str] = ..., device: _Optional[str] = ..., peak_memory_bytes: _Optional[int] = ..., marginal_j: _Optional[float] = ..., read_route: _Optional[str] = ..., forward: _Optional[str] = ..., time: _Optional[_Union[ShardTime, _Mapping]] = ..., placed_at: _Optional[float] = ..., finished_at: _Optional[float] = ...) -> None: ...

class ShardTime(_message.Message):
    __slots__ = ("load_s", "first_batch_s", "warm_up_s", "input_wait_s", "output_s", "tuning_s")
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_BATCH_S_FIELD_NUMBER: _ClassVar[int]
    WARM_UP_S_FIELD_NUMBER: _ClassVar[int]
    INPUT_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_S_FIELD_NUMBER: _ClassVar[int]
    TUNING_S_FIELD_NUMBER: _ClassVar[int]
    load_s: float
    first_batch_s: float
    warm_up_s: float
    input_wait_s: float
    output_s: float
    tuning_s: float
    def __init__(self, load_s: _Optional[float] = ..., first_batch_s: _Optional[float] = ..., warm_up_s: _Optional[float] = ..., input_wait_s: _Optional[float] = ..., output_s: _Optional[float] = ..., tuning_s: _Optional[float] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "name", "kind", "state", "shards", "output", "error", "created_at", "started_at", "finished_at", "items", "metrics", "explanation", "spec_yaml", "energy_j", "energy_sources", "marginal_j", "run")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    SPEC_YAML_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    ENERGY_SOURCES_FIELD_NUMBER: _ClassVar[int]
    MARGINAL_J_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    kind: str
    state: str
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    output: str
    error: str
    created_at: float
    started_at: float
    finished_at: float
    items: int
    metrics: _containers.ScalarMap[str, float]
    explanation: str
    spec_yaml: str
    energy_j: float
    energy_sources: _containers.RepeatedScalarFieldContainer[str]
    marginal_j: float
    run: int
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., kind: _Optional[str] = ..., state: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ..., output: _Optional[str] = ..., error: _Optional[str] = ..., created_at: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., items: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., explanation: _Optional[str] = ..., spec_yaml: _Optional[str] = ..., energy_j: _Optional[float] = ..., energy_sources: _Optional[_Iterable[str]] = ..., marginal_j: _Optional[float] = ..., run: _Optional[int] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class RetryMissingRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobsRequest(_message.Message):
    __slots__ = ("job_ids", "outputs")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    outputs: bool
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., outputs: _Optional[bool] = ...) -> None: ...

class PruneJobsRequest(_message.Message):
    __slots__ = ("older_than_s", "states", "outputs")
    OLDER_THAN_S_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    older_than_s: float
    states: _containers.RepeatedScalarFieldContainer[str]
    outputs: bool
    def __init__(self, older_than_s: _Optional[float] = ..., states: _Optional[_Iterable[str]] = ..., outputs: _Optional[bool] = ...) -> None: ...

class DeletedJob(_message.Message):
    __slots__ = ("id", "name", "state", "output", "outputs_removed", "outputs_kept")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_KEPT_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    state: str
    output: str
    outputs_removed: bool
    outputs_kept: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., output: _Optional[str] = ..., outputs_removed: _Optional[bool] = ..., outputs_kept: _Optional[str] = ...) -> None: ...

class DeleteJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[DeletedJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[DeletedJob, _Mapping]]] = ...) -> None: ...

class LogsRequest(_message.Message):
    __slots__ = ("job_id", "shard", "after")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    shard: int
    after: int
    def __init__(self, job_id: _Optional[str] = ..., shard: _Optional[int] = ..., after: _Optional[int] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("ts", "level", "message", "id", "shard")
    TS_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ts: float
    level: str
    message: str
    id: int
    shard: int
    def __init__(self, ts: _Optional[float] = ..., level: _Optional[str] = ..., message: _Optional[str] = ..., id: _Optional[int] = ..., shard: _Optional[int] = ...) -> None: ...

class LogsReply(_message.Message):
    __slots__ = ("lines",)
    LINES_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    def __init__(self, lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ...) -> None: ...
