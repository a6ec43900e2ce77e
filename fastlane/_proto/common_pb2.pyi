import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MisfireKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MISFIRE_KIND_UNSPECIFIED: _ClassVar[MisfireKind]
    MISFIRE_KIND_FIRE_ONCE: _ClassVar[MisfireKind]
    MISFIRE_KIND_FIRE_ALL: _ClassVar[MisfireKind]
    MISFIRE_KIND_SKIP: _ClassVar[MisfireKind]

class OverlapPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERLAP_POLICY_UNSPECIFIED: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_ALLOW: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_SKIP: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_BUFFER_ONE: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_BUFFER_ALL: _ClassVar[OverlapPolicy]
    OVERLAP_POLICY_CANCEL_PREVIOUS: _ClassVar[OverlapPolicy]

class Delivery(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_UNSPECIFIED: _ClassVar[Delivery]
    DELIVERY_AT_LEAST_ONCE: _ClassVar[Delivery]
    DELIVERY_AT_MOST_ONCE: _ClassVar[Delivery]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_ACTIVE: _ClassVar[JobState]
    JOB_STATE_PAUSED: _ClassVar[JobState]
    JOB_STATE_COMPLETED: _ClassVar[JobState]
    JOB_STATE_ERRORED: _ClassVar[JobState]

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_BUFFERED: _ClassVar[RunState]
    RUN_STATE_SCHEDULED: _ClassVar[RunState]
    RUN_STATE_DISPATCHED: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_SUCCEEDED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_DEAD: _ClassVar[RunState]
    RUN_STATE_SKIPPED: _ClassVar[RunState]
    RUN_STATE_CANCELLED: _ClassVar[RunState]
    RUN_STATE_LOST: _ClassVar[RunState]

class AttemptOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_OUTCOME_UNSPECIFIED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_PENDING: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_SUCCEEDED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_FAILED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_PERMANENT_FAILURE: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_TIMED_OUT: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_LEASE_EXPIRED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_CANCELLED: _ClassVar[AttemptOutcome]
    ATTEMPT_OUTCOME_SUPERSEDED: _ClassVar[AttemptOutcome]
MISFIRE_KIND_UNSPECIFIED: MisfireKind
MISFIRE_KIND_FIRE_ONCE: MisfireKind
MISFIRE_KIND_FIRE_ALL: MisfireKind
MISFIRE_KIND_SKIP: MisfireKind
OVERLAP_POLICY_UNSPECIFIED: OverlapPolicy
OVERLAP_POLICY_ALLOW: OverlapPolicy
OVERLAP_POLICY_SKIP: OverlapPolicy
OVERLAP_POLICY_BUFFER_ONE: OverlapPolicy
OVERLAP_POLICY_BUFFER_ALL: OverlapPolicy
OVERLAP_POLICY_CANCEL_PREVIOUS: OverlapPolicy
DELIVERY_UNSPECIFIED: Delivery
DELIVERY_AT_LEAST_ONCE: Delivery
DELIVERY_AT_MOST_ONCE: Delivery
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_ACTIVE: JobState
JOB_STATE_PAUSED: JobState
JOB_STATE_COMPLETED: JobState
JOB_STATE_ERRORED: JobState
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_BUFFERED: RunState
RUN_STATE_SCHEDULED: RunState
RUN_STATE_DISPATCHED: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_SUCCEEDED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_DEAD: RunState
RUN_STATE_SKIPPED: RunState
RUN_STATE_CANCELLED: RunState
RUN_STATE_LOST: RunState
ATTEMPT_OUTCOME_UNSPECIFIED: AttemptOutcome
ATTEMPT_OUTCOME_PENDING: AttemptOutcome
ATTEMPT_OUTCOME_SUCCEEDED: AttemptOutcome
ATTEMPT_OUTCOME_FAILED: AttemptOutcome
ATTEMPT_OUTCOME_PERMANENT_FAILURE: AttemptOutcome
ATTEMPT_OUTCOME_TIMED_OUT: AttemptOutcome
ATTEMPT_OUTCOME_LEASE_EXPIRED: AttemptOutcome
ATTEMPT_OUTCOME_CANCELLED: AttemptOutcome
ATTEMPT_OUTCOME_SUPERSEDED: AttemptOutcome

class Schedule(_message.Message):
    __slots__ = ("now", "at", "cron", "interval", "jitter")
    NOW_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    now: Now
    at: _timestamp_pb2.Timestamp
    cron: Cron
    interval: Interval
    jitter: _duration_pb2.Duration
    def __init__(self, now: _Optional[_Union[Now, _Mapping]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cron: _Optional[_Union[Cron, _Mapping]] = ..., interval: _Optional[_Union[Interval, _Mapping]] = ..., jitter: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Now(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cron(_message.Message):
    __slots__ = ("expression", "timezone")
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    expression: str
    timezone: str
    def __init__(self, expression: _Optional[str] = ..., timezone: _Optional[str] = ...) -> None: ...

class Interval(_message.Message):
    __slots__ = ("every", "anchor")
    EVERY_FIELD_NUMBER: _ClassVar[int]
    ANCHOR_FIELD_NUMBER: _ClassVar[int]
    every: _duration_pb2.Duration
    anchor: _timestamp_pb2.Timestamp
    def __init__(self, every: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., anchor: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "max_retry_time", "backoff_base", "backoff_cap")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRY_TIME_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_BASE_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_CAP_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    max_retry_time: _duration_pb2.Duration
    backoff_base: _duration_pb2.Duration
    backoff_cap: _duration_pb2.Duration
    def __init__(self, max_attempts: _Optional[int] = ..., max_retry_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_base: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff_cap: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class MisfirePolicy(_message.Message):
    __slots__ = ("kind", "grace", "fire_all_cap")
    KIND_FIELD_NUMBER: _ClassVar[int]
    GRACE_FIELD_NUMBER: _ClassVar[int]
    FIRE_ALL_CAP_FIELD_NUMBER: _ClassVar[int]
    kind: MisfireKind
    grace: _duration_pb2.Duration
    fire_all_cap: int
    def __init__(self, kind: _Optional[_Union[MisfireKind, str]] = ..., grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., fire_all_cap: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("tenant", "name", "job_type", "schedule", "payload", "priority", "concurrency_key", "retry", "misfire", "overlap", "delivery", "timeout", "lease_ttl", "concurrency_limit")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    MISFIRE_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    name: str
    job_type: str
    schedule: Schedule
    payload: bytes
    priority: int
    concurrency_key: str
    retry: RetryPolicy
    misfire: MisfirePolicy
    overlap: OverlapPolicy
    delivery: Delivery
    timeout: _duration_pb2.Duration
    lease_ttl: _duration_pb2.Duration
    concurrency_limit: int
    def __init__(self, tenant: _Optional[str] = ..., name: _Optional[str] = ..., job_type: _Optional[str] = ..., schedule: _Optional[_Union[Schedule, _Mapping]] = ..., payload: _Optional[bytes] = ..., priority: _Optional[int] = ..., concurrency_key: _Optional[str] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., misfire: _Optional[_Union[MisfirePolicy, _Mapping]] = ..., overlap: _Optional[_Union[OverlapPolicy, str]] = ..., delivery: _Optional[_Union[Delivery, str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., concurrency_limit: _Optional[int] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "spec", "state", "next_fire_at", "created_at", "updated_at", "version", "shard_id", "error", "pause_reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PAUSE_REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: JobSpec
    state: JobState
    next_fire_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    version: int
    shard_id: int
    error: str
    pause_reason: str
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., next_fire_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., version: _Optional[int] = ..., shard_id: _Optional[int] = ..., error: _Optional[str] = ..., pause_reason: _Optional[str] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "job_id", "tenant", "job_type", "scheduled_for", "available_at", "state", "attempts", "manual", "worker_id", "progress", "last_error", "created_at", "finished_at", "idempotency_key", "shard_id", "checkpoint_bytes", "cancel_requested", "first_attempt_at", "first_started_at", "backfill_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FOR_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    FIRST_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    FIRST_STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    BACKFILL_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    job_id: str
    tenant: str
    job_type: str
    scheduled_for: _timestamp_pb2.Timestamp
    available_at: _timestamp_pb2.Timestamp
    state: RunState
    attempts: int
    manual: bool
    worker_id: str
    progress: float
    last_error: str
    created_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    idempotency_key: str
    shard_id: int
    checkpoint_bytes: int
    cancel_requested: bool
    first_attempt_at: _timestamp_pb2.Timestamp
    first_started_at: _timestamp_pb2.Timestamp
    backfill_id: str
    def __init__(self, run_id: _Optional[str] = ..., job_id: _Optional[str] = ..., tenant: _Optional[str] = ..., job_type: _Optional[str] = ..., scheduled_for: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., available_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[RunState, str]] = ..., attempts: _Optional[int] = ..., manual: _Optional[bool] = ..., worker_id: _Optional[str] = ..., progress: _Optional[float] = ..., last_error: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., shard_id: _Optional[int] = ..., checkpoint_bytes: _Optional[int] = ..., cancel_requested: _Optional[bool] = ..., first_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., first_started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., backfill_id: _Optional[str] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt", "worker_id", "node_id", "outcome", "dispatched_at", "started_at", "finished_at", "error_code", "error_message", "reported_late", "redelivery", "error_traceback")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REPORTED_LATE_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_FIELD_NUMBER: _ClassVar[int]
    ERROR_TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    worker_id: str
    node_id: str
    outcome: AttemptOutcome
    dispatched_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    error_code: str
    error_message: str
    reported_late: bool
    redelivery: bool
    error_traceback: str
    def __init__(self, attempt: _Optional[int] = ..., worker_id: _Optional[str] = ..., node_id: _Optional[str] = ..., outcome: _Optional[_Union[AttemptOutcome, str]] = ..., dispatched_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., reported_late: _Optional[bool] = ..., redelivery: _Optional[bool] = ..., error_traceback: _Optional[str] = ...) -> None: ...
