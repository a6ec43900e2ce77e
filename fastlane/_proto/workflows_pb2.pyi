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

class WorkflowRunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKFLOW_RUN_STATE_UNSPECIFIED: _ClassVar[WorkflowRunState]
    WORKFLOW_RUN_STATE_RUNNING: _ClassVar[WorkflowRunState]
    WORKFLOW_RUN_STATE_SUCCEEDED: _ClassVar[WorkflowRunState]
    WORKFLOW_RUN_STATE_FAILED: _ClassVar[WorkflowRunState]
    WORKFLOW_RUN_STATE_CANCELLED: _ClassVar[WorkflowRunState]

class StepState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATE_UNSPECIFIED: _ClassVar[StepState]
    STEP_STATE_WAITING: _ClassVar[StepState]
    STEP_STATE_ACTIVE: _ClassVar[StepState]
    STEP_STATE_SUCCEEDED: _ClassVar[StepState]
    STEP_STATE_FAILED: _ClassVar[StepState]
    STEP_STATE_SKIPPED: _ClassVar[StepState]
    STEP_STATE_CANCELLED: _ClassVar[StepState]
WORKFLOW_RUN_STATE_UNSPECIFIED: WorkflowRunState
WORKFLOW_RUN_STATE_RUNNING: WorkflowRunState
WORKFLOW_RUN_STATE_SUCCEEDED: WorkflowRunState
WORKFLOW_RUN_STATE_FAILED: WorkflowRunState
WORKFLOW_RUN_STATE_CANCELLED: WorkflowRunState
STEP_STATE_UNSPECIFIED: StepState
STEP_STATE_WAITING: StepState
STEP_STATE_ACTIVE: StepState
STEP_STATE_SUCCEEDED: StepState
STEP_STATE_FAILED: StepState
STEP_STATE_SKIPPED: StepState
STEP_STATE_CANCELLED: StepState

class CreateWorkflowRequest(_message.Message):
    __slots__ = ("tenant", "definition")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    definition: str
    def __init__(self, tenant: _Optional[str] = ..., definition: _Optional[str] = ...) -> None: ...

class CreateWorkflowResponse(_message.Message):
    __slots__ = ("workflow", "created")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    workflow: Workflow
    created: bool
    def __init__(self, workflow: _Optional[_Union[Workflow, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class Workflow(_message.Message):
    __slots__ = ("workflow_id", "name", "version", "job_id", "definition", "created_at", "tenant")
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    workflow_id: str
    name: str
    version: int
    job_id: str
    definition: str
    created_at: _timestamp_pb2.Timestamp
    tenant: str
    def __init__(self, workflow_id: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., job_id: _Optional[str] = ..., definition: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tenant: _Optional[str] = ...) -> None: ...

class GetWorkflowRequest(_message.Message):
    __slots__ = ("tenant", "name", "version")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    name: str
    version: int
    def __init__(self, tenant: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetWorkflowResponse(_message.Message):
    __slots__ = ("workflow",)
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    workflow: Workflow
    def __init__(self, workflow: _Optional[_Union[Workflow, _Mapping]] = ...) -> None: ...

class ListWorkflowsRequest(_message.Message):
    __slots__ = ("tenant", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorkflowsResponse(_message.Message):
    __slots__ = ("workflows", "next_page_token")
    WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    workflows: _containers.RepeatedCompositeFieldContainer[Workflow]
    next_page_token: str
    def __init__(self, workflows: _Optional[_Iterable[_Union[Workflow, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class TriggerWorkflowRequest(_message.Message):
    __slots__ = ("tenant", "name", "input")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    name: str
    input: bytes
    def __init__(self, tenant: _Optional[str] = ..., name: _Optional[str] = ..., input: _Optional[bytes] = ...) -> None: ...

class TriggerWorkflowResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: WorkflowRun
    def __init__(self, run: _Optional[_Union[WorkflowRun, _Mapping]] = ...) -> None: ...

class WorkflowRun(_message.Message):
    __slots__ = ("workflow_run_id", "tenant", "workflow_name", "version", "state", "input", "error", "created_at", "finished_at", "job_id")
    WORKFLOW_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    workflow_run_id: str
    tenant: str
    workflow_name: str
    version: int
    state: WorkflowRunState
    input: bytes
    error: str
    created_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    job_id: str
    def __init__(self, workflow_run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., workflow_name: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[_Union[WorkflowRunState, str]] = ..., input: _Optional[bytes] = ..., error: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job_id: _Optional[str] = ...) -> None: ...

class ListWorkflowRunsRequest(_message.Message):
    __slots__ = ("tenant", "name", "page_size", "page_token", "id_prefix")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    name: str
    page_size: int
    page_token: str
    id_prefix: str
    def __init__(self, tenant: _Optional[str] = ..., name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., id_prefix: _Optional[str] = ...) -> None: ...

class ListWorkflowRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[WorkflowRun]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[WorkflowRun, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetWorkflowRunRequest(_message.Message):
    __slots__ = ("tenant", "workflow_run_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    workflow_run_id: str
    def __init__(self, tenant: _Optional[str] = ..., workflow_run_id: _Optional[str] = ...) -> None: ...

class CancelWorkflowRunRequest(_message.Message):
    __slots__ = ("tenant", "workflow_run_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    workflow_run_id: str
    def __init__(self, tenant: _Optional[str] = ..., workflow_run_id: _Optional[str] = ...) -> None: ...

class CancelWorkflowRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: WorkflowRun
    def __init__(self, run: _Optional[_Union[WorkflowRun, _Mapping]] = ...) -> None: ...

class ResumeWorkflowRunRequest(_message.Message):
    __slots__ = ("tenant", "workflow_run_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    workflow_run_id: str
    def __init__(self, tenant: _Optional[str] = ..., workflow_run_id: _Optional[str] = ...) -> None: ...

class ResumeWorkflowRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: WorkflowRun
    def __init__(self, run: _Optional[_Union[WorkflowRun, _Mapping]] = ...) -> None: ...

class StepStatus(_message.Message):
    __slots__ = ("name", "state", "run_ids", "error", "run_states", "outputs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RUN_STATES_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: StepState
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    error: str
    run_states: _containers.RepeatedScalarFieldContainer[_common_pb2.RunState]
    outputs: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[StepState, str]] = ..., run_ids: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ..., run_states: _Optional[_Iterable[_Union[_common_pb2.RunState, str]]] = ..., outputs: _Optional[_Iterable[bytes]] = ...) -> None: ...

class GetWorkflowRunResponse(_message.Message):
    __slots__ = ("run", "workflow", "steps")
    RUN_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    run: WorkflowRun
    workflow: Workflow
    steps: _containers.RepeatedCompositeFieldContainer[StepStatus]
    def __init__(self, run: _Optional[_Union[WorkflowRun, _Mapping]] = ..., workflow: _Optional[_Union[Workflow, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[StepStatus, _Mapping]]] = ...) -> None: ...
