import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_ADMIN: _ClassVar[Role]
    ROLE_CLIENT: _ClassVar[Role]
    ROLE_WORKER: _ClassVar[Role]
    ROLE_VIEWER: _ClassVar[Role]
ROLE_UNSPECIFIED: Role
ROLE_ADMIN: Role
ROLE_CLIENT: Role
ROLE_WORKER: Role
ROLE_VIEWER: Role

class GetClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterResponse(_message.Message):
    __slots__ = ("database_time", "nodes", "shards", "workers")
    DATABASE_TIME_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    database_time: _timestamp_pb2.Timestamp
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    def __init__(self, database_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "tenant", "job_types", "credits", "in_flight", "node_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPES_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    tenant: str
    job_types: _containers.RepeatedScalarFieldContainer[str]
    credits: int
    in_flight: int
    node_id: str
    def __init__(self, worker_id: _Optional[str] = ..., tenant: _Optional[str] = ..., job_types: _Optional[_Iterable[str]] = ..., credits: _Optional[int] = ..., in_flight: _Optional[int] = ..., node_id: _Optional[str] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "address", "shards_owned", "workers_connected", "clock_offset_ms", "heap_size", "ready_runs", "ready", "eligible", "note", "heartbeat_at", "live")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_OWNED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_MS_FIELD_NUMBER: _ClassVar[int]
    HEAP_SIZE_FIELD_NUMBER: _ClassVar[int]
    READY_RUNS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    shards_owned: int
    workers_connected: int
    clock_offset_ms: float
    heap_size: int
    ready_runs: int
    ready: bool
    eligible: bool
    note: str
    heartbeat_at: _timestamp_pb2.Timestamp
    live: bool
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., shards_owned: _Optional[int] = ..., workers_connected: _Optional[int] = ..., clock_offset_ms: _Optional[float] = ..., heap_size: _Optional[int] = ..., ready_runs: _Optional[int] = ..., ready: _Optional[bool] = ..., eligible: _Optional[bool] = ..., note: _Optional[str] = ..., heartbeat_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., live: _Optional[bool] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("shard_id", "owner", "token", "lease_expires_at")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    shard_id: int
    owner: str
    token: int
    lease_expires_at: _timestamp_pb2.Timestamp
    def __init__(self, shard_id: _Optional[int] = ..., owner: _Optional[str] = ..., token: _Optional[int] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ApiToken(_message.Message):
    __slots__ = ("token_id", "tenant", "role", "name", "created_at", "expires_at", "revoked_at", "last_used_at")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_AT_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    tenant: str
    role: Role
    name: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    last_used_at: _timestamp_pb2.Timestamp
    def __init__(self, token_id: _Optional[str] = ..., tenant: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., name: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_used_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("tenant", "role", "name", "expires_in")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    role: Role
    name: str
    expires_in: _duration_pb2.Duration
    def __init__(self, tenant: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., name: _Optional[str] = ..., expires_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "secret")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    token: ApiToken
    secret: str
    def __init__(self, token: _Optional[_Union[ApiToken, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[ApiToken]
    def __init__(self, tokens: _Optional[_Iterable[_Union[ApiToken, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("token_id",)
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    def __init__(self, token_id: _Optional[str] = ...) -> None: ...

class RevokeTokenResponse(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: ApiToken
    def __init__(self, token: _Optional[_Union[ApiToken, _Mapping]] = ...) -> None: ...

class Quota(_message.Message):
    __slots__ = ("max_jobs", "job_creations_per_second", "max_waiting_runs")
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    JOB_CREATIONS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MAX_WAITING_RUNS_FIELD_NUMBER: _ClassVar[int]
    max_jobs: int
    job_creations_per_second: float
    max_waiting_runs: int
    def __init__(self, max_jobs: _Optional[int] = ..., job_creations_per_second: _Optional[float] = ..., max_waiting_runs: _Optional[int] = ...) -> None: ...

class GetQuotaRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("tenant", "override", "reset")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    override: Quota
    reset: bool
    def __init__(self, tenant: _Optional[str] = ..., override: _Optional[_Union[Quota, _Mapping]] = ..., reset: _Optional[bool] = ...) -> None: ...

class GetQuotaResponse(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: QuotaStatus
    def __init__(self, quota: _Optional[_Union[QuotaStatus, _Mapping]] = ...) -> None: ...

class SetQuotaResponse(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: QuotaStatus
    def __init__(self, quota: _Optional[_Union[QuotaStatus, _Mapping]] = ...) -> None: ...

class QuotaStatus(_message.Message):
    __slots__ = ("tenant", "in_force", "override")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    IN_FORCE_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    in_force: Quota
    override: Quota
    def __init__(self, tenant: _Optional[str] = ..., in_force: _Optional[_Union[Quota, _Mapping]] = ..., override: _Optional[_Union[Quota, _Mapping]] = ...) -> None: ...
