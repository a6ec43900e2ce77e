"""Which roles may make which call: one table, deny by default.

Keys are full gRPC method names (``/package.Service/Method``). A method missing from the table
is refused to every role, so a new RPC is closed until it is given a line here (a test checks
that every served method has one). Health checks are open: probes carry no token.
"""

from __future__ import annotations

from typing import Final

from fastlane.domain.access import Role

ADMIN, CLIENT, WORKER, VIEWER = Role.ADMIN, Role.CLIENT, Role.WORKER, Role.VIEWER

READ: Final = frozenset({ADMIN, CLIENT, VIEWER})
WRITE: Final = frozenset({ADMIN, CLIENT})
EVERYONE: Final = frozenset(Role)

ALLOWED: Final[dict[str, frozenset[Role]]] = {
    "/fastlane.v1.JobService/CreateJob": WRITE,
    "/fastlane.v1.JobService/UpdateJob": WRITE,
    "/fastlane.v1.JobService/PauseJob": WRITE,
    "/fastlane.v1.JobService/ResumeJob": WRITE,
    "/fastlane.v1.JobService/DeleteJob": WRITE,
    "/fastlane.v1.JobService/TriggerJob": WRITE,
    "/fastlane.v1.JobService/ActOnJobs": WRITE,
    "/fastlane.v1.JobService/BackfillJob": WRITE,
    "/fastlane.v1.JobService/GetJob": READ,
    "/fastlane.v1.JobService/ListJobs": READ,
    "/fastlane.v1.JobService/PreviewSchedule": READ,
    "/fastlane.v1.JobService/ListAudit": READ,
    "/fastlane.v1.RunService/ListRuns": READ,
    "/fastlane.v1.RunService/GetRun": READ,
    "/fastlane.v1.RunService/CancelRun": WRITE,
    "/fastlane.v1.RunService/RetryRun": WRITE,
    "/fastlane.v1.RunService/ActOnRuns": WRITE,
    "/fastlane.v1.WorkflowService/CreateWorkflow": WRITE,
    "/fastlane.v1.WorkflowService/TriggerWorkflow": WRITE,
    "/fastlane.v1.WorkflowService/CancelWorkflowRun": WRITE,
    "/fastlane.v1.WorkflowService/ResumeWorkflowRun": WRITE,
    "/fastlane.v1.WorkflowService/GetWorkflow": READ,
    "/fastlane.v1.WorkflowService/ListWorkflows": READ,
    "/fastlane.v1.WorkflowService/ListWorkflowRuns": READ,
    "/fastlane.v1.WorkflowService/GetWorkflowRun": READ,
    "/fastlane.v1.WorkerService/Connect": frozenset({ADMIN, WORKER}),
    # Every role, each seeing its part (servicers/admin.py): workers follow the membership with it,
    # clients see which workers serve a job type; node addresses and shards are not for all.
    "/fastlane.v1.AdminService/GetCluster": EVERYONE,
    "/fastlane.v1.AdminService/CreateToken": frozenset({ADMIN}),
    "/fastlane.v1.AdminService/ListTokens": frozenset({ADMIN}),
    "/fastlane.v1.AdminService/RevokeToken": frozenset({ADMIN}),
    "/fastlane.v1.AdminService/GetQuota": READ,
    "/fastlane.v1.AdminService/SetQuota": frozenset({ADMIN}),
    # Reflection describes the API, not data: any valid token may use it.
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": EVERYONE,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": EVERYONE,
}

# Served without a token: Kubernetes probes and load balancers cannot present one.
OPEN: Final = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


def may_call(role: Role, method: str) -> bool:
    """Whether ``role`` may call ``method`` (a full gRPC method name)."""
    return role in ALLOWED.get(method, frozenset())
