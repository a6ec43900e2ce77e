import datetime

from fastlane._proto import common_pb2 as _common_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_ACTION_UNSPECIFIED: _ClassVar[RunAction]
    RUN_ACTION_CANCEL: _ClassVar[RunAction]
    RUN_ACTION_RETRY: _ClassVar[RunAction]
RUN_ACTION_UNSPECIFIED: RunAction
RUN_ACTION_CANCEL: RunAction
RUN_ACTION_RETRY: RunAction

class RunSelection(_message.Message):
    __slots__ = ("job_id", "job_type", "states", "scheduled_from", "scheduled_before", "backfill_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FROM_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    BACKFILL_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job_type: str
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.RunState]
    scheduled_from: _timestamp_pb2.Timestamp
    scheduled_before: _timestamp_pb2.Timestamp
    backfill_id: str
    def __init__(self, job_id: _Optional[str] = ..., job_type: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_common_pb2.RunState, str]]] = ..., scheduled_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scheduled_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., backfill_id: _Optional[str] = ...) -> None: ...

class ActOnRunsRequest(_message.Message):
    __slots__ = ("tenant", "action", "selection", "dry_run", "limit", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SELECTION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    action: RunAction
    selection: RunSelection
    dry_run: bool
    limit: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., action: _Optional[_Union[RunAction, str]] = ..., selection: _Optional[_Union[RunSelection, _Mapping]] = ..., dry_run: _Optional[bool] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ActOnRunsResponse(_message.Message):
    __slots__ = ("matched", "acted", "skipped", "next_page_token", "stopped_because")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    ACTED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STOPPED_BECAUSE_FIELD_NUMBER: _ClassVar[int]
    matched: int
    acted: int
    skipped: int
    next_page_token: str
    stopped_because: str
    def __init__(self, matched: _Optional[int] = ..., acted: _Optional[int] = ..., skipped: _Optional[int] = ..., next_page_token: _Optional[str] = ..., stopped_because: _Optional[str] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("tenant", "run_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    run_id: str
    def __init__(self, tenant: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("tenant", "run_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    run_id: str
    def __init__(self, tenant: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class RetryRunRequest(_message.Message):
    __slots__ = ("tenant", "run_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    run_id: str
    def __init__(self, tenant: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class RetryRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("tenant", "job_id", "states", "page_size", "page_token", "id_prefix", "scheduled_from", "scheduled_before", "job_type", "backfill_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FROM_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    BACKFILL_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.RunState]
    page_size: int
    page_token: str
    id_prefix: str
    scheduled_from: _timestamp_pb2.Timestamp
    scheduled_before: _timestamp_pb2.Timestamp
    job_type: str
    backfill_id: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_common_pb2.RunState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., id_prefix: _Optional[str] = ..., scheduled_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scheduled_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job_type: _Optional[str] = ..., backfill_id: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_common_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run", "attempts", "checkpoint", "payload", "output", "payloads_hidden")
    RUN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    attempts: _containers.RepeatedCompositeFieldContainer[_common_pb2.Attempt]
    checkpoint: bytes
    payload: bytes
    output: bytes
    payloads_hidden: bool
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., attempts: _Optional[_Iterable[_Union[_common_pb2.Attempt, _Mapping]]] = ..., checkpoint: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., output: _Optional[bytes] = ..., payloads_hidden: _Optional[bool] = ...) -> None: ...
