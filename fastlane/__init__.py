"""fastlane: a precise, durable, sharded job scheduler.

This package is the public API, and everything in it is importable from here: the async
:class:`Client`, the :class:`Worker` with its :class:`RunContext` and :func:`apply_once`, the
schedule and policy values a job is made of, the records calls return, and every error a user
may catch (drawn as a tree in :mod:`fastlane.errors`). :mod:`fastlane.testing` helps test
handlers without a daemon. Every other module is the daemon's and may change in any release.
"""

from fastlane.auth.tls import ClientTls
from fastlane.client import Client, JobOptions
from fastlane.client.bulk_calls import BackfillProgress
from fastlane.domain.access import ApiToken, Role
from fastlane.domain.audit import AuditAction, AuditEvent, AuditTarget
from fastlane.domain.backfill import BackfillMode
from fastlane.domain.cluster import ClusterStatus, NodeStatus, ShardStatus, WorkerStatus
from fastlane.domain.models import (
    Attempt,
    AttemptOutcome,
    Delivery,
    Job,
    JobSpec,
    JobState,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Run,
    RunState,
    Schedule,
    ScheduleKind,
)
from fastlane.domain.quotas import TenantQuota
from fastlane.domain.records import BulkOutcome, JobAction, JobFilter, Page, RunAction, RunFilter
from fastlane.domain.workflows import StepState, StepView, Workflow, WorkflowRun, WorkflowRunState
from fastlane.errors import (
    ConfigurationError,
    FastlaneError,
    InvalidArgument,
    PermanentError,
    RemoteAlreadyExists,
    RemoteError,
    RemoteInvalidArgument,
    RemoteNotFound,
    RemotePermissionDenied,
    RemoteUnauthenticated,
    RemoteUnavailable,
    RetryableError,
    ScheduleError,
    UnknownTimeZone,
)
from fastlane.worker import ClockEstimate, Handler, RunContext, Worker, apply_once
from fastlane.worker.effects import EffectResult

__all__ = [
    "ApiToken",
    "Attempt",
    "AttemptOutcome",
    "AuditAction",
    "AuditEvent",
    "AuditTarget",
    "BackfillMode",
    "BackfillProgress",
    "BulkOutcome",
    "Client",
    "ClientTls",
    "ClockEstimate",
    "ClusterStatus",
    "ConfigurationError",
    "Delivery",
    "EffectResult",
    "FastlaneError",
    "Handler",
    "InvalidArgument",
    "Job",
    "JobAction",
    "JobFilter",
    "JobOptions",
    "JobSpec",
    "JobState",
    "MisfireKind",
    "MisfirePolicy",
    "NodeStatus",
    "OverlapPolicy",
    "Page",
    "PermanentError",
    "RemoteAlreadyExists",
    "RemoteError",
    "RemoteInvalidArgument",
    "RemoteNotFound",
    "RemotePermissionDenied",
    "RemoteUnauthenticated",
    "RemoteUnavailable",
    "RetryPolicy",
    "RetryableError",
    "Role",
    "Run",
    "RunAction",
    "RunContext",
    "RunFilter",
    "RunState",
    "Schedule",
    "ScheduleError",
    "ScheduleKind",
    "ShardStatus",
    "StepState",
    "StepView",
    "TenantQuota",
    "UnknownTimeZone",
    "Worker",
    "WorkerStatus",
    "Workflow",
    "WorkflowRun",
    "WorkflowRunState",
    "apply_once",
]
