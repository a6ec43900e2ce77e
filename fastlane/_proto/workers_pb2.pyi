import datetime

from fastlane._proto import common_pb2 as _common_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConnectRequest(_message.Message):
    __slots__ = ("hello", "credit", "heartbeats", "results", "clock_probe", "drain")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_PROBE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    credit: CreditGrant
    heartbeats: Heartbeats
    results: Results
    clock_probe: ClockProbe
    drain: Drain
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., credit: _Optional[_Union[CreditGrant, _Mapping]] = ..., heartbeats: _Optional[_Union[Heartbeats, _Mapping]] = ..., results: _Optional[_Union[Results, _Mapping]] = ..., clock_probe: _Optional[_Union[ClockProbe, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "job_types", "credits", "tenant")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPES_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    job_types: _containers.RepeatedScalarFieldContainer[str]
    credits: int
    tenant: str
    def __init__(self, worker_id: _Optional[str] = ..., job_types: _Optional[_Iterable[str]] = ..., credits: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class CreditGrant(_message.Message):
    __slots__ = ("credits",)
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    credits: int
    def __init__(self, credits: _Optional[int] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Heartbeats(_message.Message):
    __slots__ = ("beats",)
    BEATS_FIELD_NUMBER: _ClassVar[int]
    beats: _containers.RepeatedCompositeFieldContainer[RunHeartbeat]
    def __init__(self, beats: _Optional[_Iterable[_Union[RunHeartbeat, _Mapping]]] = ...) -> None: ...

class RunHeartbeat(_message.Message):
    __slots__ = ("run_id", "lease_token", "started", "progress", "checkpoint", "started_at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    lease_token: int
    started: bool
    progress: float
    checkpoint: bytes
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., lease_token: _Optional[int] = ..., started: _Optional[bool] = ..., progress: _Optional[float] = ..., checkpoint: _Optional[bytes] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Results(_message.Message):
    __slots__ = ("results", "credits")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RunResult]
    credits: int
    def __init__(self, results: _Optional[_Iterable[_Union[RunResult, _Mapping]]] = ..., credits: _Optional[int] = ...) -> None: ...

class RunResult(_message.Message):
    __slots__ = ("run_id", "lease_token", "outcome", "error_code", "error_message", "started_at", "finished_at", "error_traceback", "output")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    lease_token: int
    outcome: _common_pb2.AttemptOutcome
    error_code: str
    error_message: str
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    error_traceback: str
    output: bytes
    def __init__(self, run_id: _Optional[str] = ..., lease_token: _Optional[int] = ..., outcome: _Optional[_Union[_common_pb2.AttemptOutcome, str]] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error_traceback: _Optional[str] = ..., output: _Optional[bytes] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("welcome", "assignments", "acks", "cancel", "clock_echo")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    CLOCK_ECHO_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    assignments: Assignments
    acks: ResultAcks
    cancel: CancelRuns
    clock_echo: ClockEcho
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., assignments: _Optional[_Union[Assignments, _Mapping]] = ..., acks: _Optional[_Union[ResultAcks, _Mapping]] = ..., cancel: _Optional[_Union[CancelRuns, _Mapping]] = ..., clock_echo: _Optional[_Union[ClockEcho, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("node_id", "heartbeat_interval", "takes_credits_with_results", "prompt_results", "takes_drain")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TAKES_CREDITS_WITH_RESULTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_RESULTS_FIELD_NUMBER: _ClassVar[int]
    TAKES_DRAIN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    heartbeat_interval: _duration_pb2.Duration
    takes_credits_with_results: bool
    prompt_results: bool
    takes_drain: bool
    def __init__(self, node_id: _Optional[str] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., takes_credits_with_results: _Optional[bool] = ..., prompt_results: _Optional[bool] = ..., takes_drain: _Optional[bool] = ...) -> None: ...

class Assignments(_message.Message):
    __slots__ = ("assignments",)
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[Assignment]
    def __init__(self, assignments: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("run_id", "job_id", "job_type", "tenant", "attempt", "payload", "scheduled_for", "idempotency_key", "lease_token", "lease_ttl", "checkpoint", "timeout", "released_at", "start_at", "awaited")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FOR_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    AWAITED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    job_id: str
    job_type: str
    tenant: str
    attempt: int
    payload: bytes
    scheduled_for: _timestamp_pb2.Timestamp
    idempotency_key: str
    lease_token: int
    lease_ttl: _duration_pb2.Duration
    checkpoint: bytes
    timeout: _duration_pb2.Duration
    released_at: _timestamp_pb2.Timestamp
    start_at: _timestamp_pb2.Timestamp
    awaited: bool
    def __init__(self, run_id: _Optional[str] = ..., job_id: _Optional[str] = ..., job_type: _Optional[str] = ..., tenant: _Optional[str] = ..., attempt: _Optional[int] = ..., payload: _Optional[bytes] = ..., scheduled_for: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., lease_token: _Optional[int] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., checkpoint: _Optional[bytes] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., released_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., awaited: _Optional[bool] = ...) -> None: ...

class ResultAcks(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[ResultAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[ResultAck, _Mapping]]] = ...) -> None: ...

class ResultAck(_message.Message):
    __slots__ = ("run_id", "lease_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    lease_token: int
    def __init__(self, run_id: _Optional[str] = ..., lease_token: _Optional[int] = ...) -> None: ...

class CancelRuns(_message.Message):
    __slots__ = ("runs", "reason", "unstarted_only")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UNSTARTED_ONLY_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[ResultAck]
    reason: str
    unstarted_only: bool
    def __init__(self, runs: _Optional[_Iterable[_Union[ResultAck, _Mapping]]] = ..., reason: _Optional[str] = ..., unstarted_only: _Optional[bool] = ...) -> None: ...

class ClockProbe(_message.Message):
    __slots__ = ("probe_id", "sent_at", "uncertainty", "offset")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    UNCERTAINTY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    probe_id: int
    sent_at: _timestamp_pb2.Timestamp
    uncertainty: _duration_pb2.Duration
    offset: _duration_pb2.Duration
    def __init__(self, probe_id: _Optional[int] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., uncertainty: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., offset: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ClockEcho(_message.Message):
    __slots__ = ("probe_id", "probe_sent_at", "node_time")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    PROBE_SENT_AT_FIELD_NUMBER: _ClassVar[int]
    NODE_TIME_FIELD_NUMBER: _ClassVar[int]
    probe_id: int
    probe_sent_at: _timestamp_pb2.Timestamp
    node_time: _timestamp_pb2.Timestamp
    def __init__(self, probe_id: _Optional[int] = ..., probe_sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., node_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
