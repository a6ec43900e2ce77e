"""The public API is closed: ``fastlane`` exports exactly the names written here, each one a real
object; what the client returns is a domain value, never a protobuf message; and the README's
examples need nothing but ``fastlane`` (and its test kit)."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import fastlane
import fastlane.testing
from fastlane import Client

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = [
    "ApiToken", "Attempt", "AttemptOutcome", "AuditAction", "AuditEvent", "AuditTarget", "BackfillMode", "BackfillProgress", "BulkOutcome", "Client", "ClientTls",
    "ClockEstimate", "ClusterStatus", "ConfigurationError", "Delivery", "EffectResult", "FastlaneError", "Handler",
    "InvalidArgument", "Job", "JobAction", "JobFilter", "JobOptions", "JobSpec", "JobState", "MisfireKind", "MisfirePolicy", "NodeStatus",
    "OverlapPolicy", "Page", "PermanentError", "RemoteAlreadyExists", "RemoteError", "RemoteInvalidArgument",
    "RemoteNotFound", "RemotePermissionDenied", "RemoteUnauthenticated", "RemoteUnavailable", "RetryPolicy",
    "RetryableError", "Role", "Run", "RunAction", "RunContext", "RunFilter", "RunState", "Schedule", "ScheduleError", "ScheduleKind",
    "ShardStatus", "StepState", "StepView", "TenantQuota", "UnknownTimeZone", "Worker", "WorkerStatus", "Workflow",
    "WorkflowRun", "WorkflowRunState", "apply_once",
]


def test_fastlane_exports_exactly_the_written_names() -> None:
    assert sorted(fastlane.__all__) == sorted(PUBLIC)
    assert [name for name in PUBLIC if getattr(fastlane, name, None) is None] == []


def test_every_error_a_user_may_catch_is_public_and_a_fastlane_error() -> None:
    errors = [getattr(fastlane, name) for name in PUBLIC if name.endswith("Error") or name == "UnknownTimeZone"]
    assert all(issubclass(error, fastlane.FastlaneError) for error in errors)
    # Every client-side error the status table can raise is exported.
    from fastlane.rpc import status

    raised = {kind.__name__ for kind in vars(status)["_FROM_STATUS"].values()}
    assert raised <= set(PUBLIC)


def test_no_client_call_speaks_protobuf() -> None:
    calls = {name: member for name, member in inspect.getmembers(Client, inspect.iscoroutinefunction)
             if not name.startswith("_")}
    assert {"create_job", "cluster", "get_workflow_run"} <= set(calls)
    leaking = {}
    for name, call in calls.items():
        hints = typing.get_type_hints(call)
        shown = " ".join(repr(hint) for hint in hints.values())
        if "_pb2" in shown or "protobuf" in shown:
            leaking[name] = shown
    assert leaking == {}


def test_the_readme_examples_import_from_fastlane_only() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    imports = [line.strip() for block in blocks for line in block.splitlines()
               if re.match(r"\s*(from|import) fastlane", line)]
    assert imports, "the README shows no import of fastlane"
    outside = [line for line in imports if not re.match(r"(from fastlane(\.testing)? import |import fastlane$)", line)]
    assert outside == []


def test_the_kit_exports_what_it_documents() -> None:
    assert {"FakeNode", "ManualClock", "until"} <= set(fastlane.testing.__all__)
