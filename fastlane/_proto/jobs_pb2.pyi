import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from fastlane._proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BackfillMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKFILL_MODE_UNSPECIFIED: _ClassVar[BackfillMode]
    BACKFILL_MODE_MISSED: _ClassVar[BackfillMode]
    BACKFILL_MODE_ALL: _ClassVar[BackfillMode]

class JobAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_ACTION_UNSPECIFIED: _ClassVar[JobAction]
    JOB_ACTION_PAUSE: _ClassVar[JobAction]
    JOB_ACTION_RESUME: _ClassVar[JobAction]
    JOB_ACTION_DELETE: _ClassVar[JobAction]

class AuditTarget(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIT_TARGET_UNSPECIFIED: _ClassVar[AuditTarget]
    AUDIT_TARGET_JOB: _ClassVar[AuditTarget]
    AUDIT_TARGET_RUN: _ClassVar[AuditTarget]

class AuditAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIT_ACTION_UNSPECIFIED: _ClassVar[AuditAction]
    AUDIT_ACTION_CREATED: _ClassVar[AuditAction]
    AUDIT_ACTION_UPDATED: _ClassVar[AuditAction]
    AUDIT_ACTION_PAUSED: _ClassVar[AuditAction]
    AUDIT_ACTION_RESUMED: _ClassVar[AuditAction]
    AUDIT_ACTION_DELETED: _ClassVar[AuditAction]
    AUDIT_ACTION_TRIGGERED: _ClassVar[AuditAction]
    AUDIT_ACTION_CANCELLED: _ClassVar[AuditAction]
    AUDIT_ACTION_RETRIED: _ClassVar[AuditAction]
    AUDIT_ACTION_BACKFILLED: _ClassVar[AuditAction]
BACKFILL_MODE_UNSPECIFIED: BackfillMode
BACKFILL_MODE_MISSED: BackfillMode
BACKFILL_MODE_ALL: BackfillMode
JOB_ACTION_UNSPECIFIED: JobAction
JOB_ACTION_PAUSE: JobAction
JOB_ACTION_RESUME: JobAction
JOB_ACTION_DELETE: JobAction
AUDIT_TARGET_UNSPECIFIED: AuditTarget
AUDIT_TARGET_JOB: AuditTarget
AUDIT_TARGET_RUN: AuditTarget
AUDIT_ACTION_UNSPECIFIED: AuditAction
AUDIT_ACTION_CREATED: AuditAction
AUDIT_ACTION_UPDATED: AuditAction
AUDIT_ACTION_PAUSED: AuditAction
AUDIT_ACTION_RESUMED: AuditAction
AUDIT_ACTION_DELETED: AuditAction
AUDIT_ACTION_TRIGGERED: AuditAction
AUDIT_ACTION_CANCELLED: AuditAction
AUDIT_ACTION_RETRIED: AuditAction
AUDIT_ACTION_BACKFILLED: AuditAction

class BackfillJobRequest(_message.Message):
    __slots__ = ("tenant", "job_id", "start", "end", "mode", "overlap", "dry_run", "limit", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    mode: BackfillMode
    overlap: _common_pb2.OverlapPolicy
    dry_run: bool
    limit: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., mode: _Optional[_Union[BackfillMode, str]] = ..., overlap: _Optional[_Union[_common_pb2.OverlapPolicy, str]] = ..., dry_run: _Optional[bool] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class BackfillJobResponse(_message.Message):
    __slots__ = ("backfill_id", "matched", "written", "already_run", "covered_until", "next_page_token")
    BACKFILL_ID_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ALREADY_RUN_FIELD_NUMBER: _ClassVar[int]
    COVERED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    backfill_id: str
    matched: int
    written: int
    already_run: int
    covered_until: _timestamp_pb2.Timestamp
    next_page_token: str
    def __init__(self, backfill_id: _Optional[str] = ..., matched: _Optional[int] = ..., written: _Optional[int] = ..., already_run: _Optional[int] = ..., covered_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class JobSelection(_message.Message):
    __slots__ = ("job_type", "states")
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    job_type: str
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.JobState]
    def __init__(self, job_type: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_common_pb2.JobState, str]]] = ...) -> None: ...

class ActOnJobsRequest(_message.Message):
    __slots__ = ("tenant", "action", "selection", "dry_run", "limit", "page_token", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SELECTION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    action: JobAction
    selection: JobSelection
    dry_run: bool
    limit: int
    page_token: str
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., action: _Optional[_Union[JobAction, str]] = ..., selection: _Optional[_Union[JobSelection, _Mapping]] = ..., dry_run: _Optional[bool] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ActOnJobsResponse(_message.Message):
    __slots__ = ("matched", "acted", "skipped", "next_page_token")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    ACTED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    matched: int
    acted: int
    skipped: int
    next_page_token: str
    def __init__(self, matched: _Optional[int] = ..., acted: _Optional[int] = ..., skipped: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("tenant", "job_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ...) -> None: ...

class CreateJobRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.JobSpec
    def __init__(self, spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class CreateJobResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    created: bool
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("tenant", "state", "job_type", "page_size", "page_token", "include_payload", "name", "id_prefix", "name_prefix")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    state: _common_pb2.JobState
    job_type: str
    page_size: int
    page_token: str
    include_payload: bool
    name: str
    id_prefix: str
    name_prefix: str
    def __init__(self, tenant: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., job_type: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., include_payload: _Optional[bool] = ..., name: _Optional[str] = ..., id_prefix: _Optional[str] = ..., name_prefix: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_common_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateJobRequest(_message.Message):
    __slots__ = ("job_id", "spec")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: _common_pb2.JobSpec
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class UpdateJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ...) -> None: ...

class PauseJobRequest(_message.Message):
    __slots__ = ("tenant", "job_id", "reason")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    reason: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ...) -> None: ...

class ResumeJobRequest(_message.Message):
    __slots__ = ("tenant", "job_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class ResumeJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("tenant", "job_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ("already_deleted",)
    ALREADY_DELETED_FIELD_NUMBER: _ClassVar[int]
    already_deleted: bool
    def __init__(self, already_deleted: _Optional[bool] = ...) -> None: ...

class TriggerJobRequest(_message.Message):
    __slots__ = ("tenant", "job_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class TriggerJobResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class PreviewScheduleRequest(_message.Message):
    __slots__ = ("schedule", "after", "count", "job_id")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    schedule: _common_pb2.Schedule
    after: _timestamp_pb2.Timestamp
    count: int
    job_id: str
    def __init__(self, schedule: _Optional[_Union[_common_pb2.Schedule, _Mapping]] = ..., after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., count: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class FireTime(_message.Message):
    __slots__ = ("utc", "local", "run_at")
    UTC_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    utc: _timestamp_pb2.Timestamp
    local: str
    run_at: _timestamp_pb2.Timestamp
    def __init__(self, utc: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., local: _Optional[str] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PreviewScheduleResponse(_message.Message):
    __slots__ = ("fire_times",)
    FIRE_TIMES_FIELD_NUMBER: _ClassVar[int]
    fire_times: _containers.RepeatedCompositeFieldContainer[FireTime]
    def __init__(self, fire_times: _Optional[_Iterable[_Union[FireTime, _Mapping]]] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("tenant", "target_kind", "target_id", "limit")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TARGET_KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    target_kind: AuditTarget
    target_id: str
    limit: int
    def __init__(self, tenant: _Optional[str] = ..., target_kind: _Optional[_Union[AuditTarget, str]] = ..., target_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("event_id", "tenant", "at", "action", "target_kind", "target_id", "job_id", "token_id", "actor", "detail")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_KIND_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    tenant: str
    at: _timestamp_pb2.Timestamp
    action: AuditAction
    target_kind: AuditTarget
    target_id: str
    job_id: str
    token_id: str
    actor: str
    detail: str
    def __init__(self, event_id: _Optional[int] = ..., tenant: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[_Union[AuditAction, str]] = ..., target_kind: _Optional[_Union[AuditTarget, str]] = ..., target_id: _Optional[str] = ..., job_id: _Optional[str] = ..., token_id: _Optional[str] = ..., actor: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ...) -> None: ...
