"""The API's enumerations: each domain ``StrEnum`` beside the protobuf enum that carries it.

A member ``foo_bar`` travels as ``PREFIX_FOO_BAR``; the zero value ``PREFIX_UNSPECIFIED`` is the
proto3 default, meaning "the default" in a policy, "any" in a filter and never sent in an
answer. The pairs are checked against each other when this module is imported, so a member added
on one side only fails at once, not when a client first meets it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Generic, TypeVar, cast

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from fastlane._proto import admin_pb2, jobs_pb2, runs_pb2, workflows_pb2
from fastlane._proto import common_pb2 as pb
from fastlane.domain.access import Role
from fastlane.domain.audit import AuditAction, AuditTarget
from fastlane.domain.backfill import BackfillMode
from fastlane.domain.models import AttemptOutcome, Delivery, JobState, MisfireKind, OverlapPolicy, RunState
from fastlane.domain.records import JobAction, RunAction
from fastlane.domain.workflows import StepState, WorkflowRunState
from fastlane.errors import InvalidArgument

E = TypeVar("E", bound=StrEnum)
W = TypeVar("W", bound=int)  # the generated enum class: an int subclass in the type stubs

UNSPECIFIED = 0


class WireEnum(Generic[E, W]):
    """One domain enumeration and its protobuf enum, in both directions."""

    def __init__(self, kind: type[E], wire: type[W], prefix: str) -> None:
        self.kind = kind
        values = cast(EnumTypeWrapper, wire)  # at run time the generated class is its wrapper
        self._numbers: dict[E, W] = {member: cast(W, values.Value(f"{prefix}_{member.value.upper()}"))
                                     for member in kind}
        self._members: dict[int, E] = {number: member for member, number in self._numbers.items()}
        extra = sorted(set(values.values()) - set(self._members) - {UNSPECIFIED})
        if extra:
            raise RuntimeError(f"{values.DESCRIPTOR.name} has values {extra} that {kind.__name__} lacks")

    def number(self, member: E) -> W:
        """The wire value of a member."""
        return self._numbers[member]

    def named(self, value: E | str, field: str) -> W:
        """The wire value of a member given as itself or as its word (what a caller typed):
        a word that is no member's is refused, naming the field."""
        try:
            return self._numbers[self.kind(value)]
        except ValueError:
            allowed = ", ".join(member.value for member in self.kind)
            raise InvalidArgument(field, f"{str(value)[:40]!r} is not one of: {allowed}") from None

    def filter(self, value: E | str | None, field: str) -> W:
        """A filter's wire value: None or empty is unspecified (any), else as :meth:`named`."""
        return self.named(value, field) if value else cast(W, UNSPECIFIED)

    def member(self, number: int, field: str, default: E | None = None) -> E:
        """The member a wire value names; unspecified is ``default``, or refused when there is none.
        An unknown number (a newer client's value, or garbage) is refused, naming the field."""
        found = self._members.get(number)
        if found is not None:
            return found
        if number == UNSPECIFIED and default is not None:
            return default
        if number == UNSPECIFIED:
            raise InvalidArgument(field, "is missing")
        allowed = ", ".join(member.value for member in self.kind)
        raise InvalidArgument(field, f"{number} is not a known value (one of: {allowed})")

    def optional(self, number: int, field: str) -> E | None:
        """A filter's member: unspecified is None (any)."""
        return None if number == UNSPECIFIED else self.member(number, field)


JOB_STATE = WireEnum(JobState, pb.JobState, "JOB_STATE")
RUN_STATE = WireEnum(RunState, pb.RunState, "RUN_STATE")
ATTEMPT_OUTCOME = WireEnum(AttemptOutcome, pb.AttemptOutcome, "ATTEMPT_OUTCOME")
OVERLAP_POLICY = WireEnum(OverlapPolicy, pb.OverlapPolicy, "OVERLAP_POLICY")
MISFIRE_KIND = WireEnum(MisfireKind, pb.MisfireKind, "MISFIRE_KIND")
DELIVERY = WireEnum(Delivery, pb.Delivery, "DELIVERY")
ROLE = WireEnum(Role, admin_pb2.Role, "ROLE")
AUDIT_ACTION = WireEnum(AuditAction, jobs_pb2.AuditAction, "AUDIT_ACTION")
AUDIT_TARGET = WireEnum(AuditTarget, jobs_pb2.AuditTarget, "AUDIT_TARGET")
WORKFLOW_RUN_STATE = WireEnum(WorkflowRunState, workflows_pb2.WorkflowRunState, "WORKFLOW_RUN_STATE")
STEP_STATE = WireEnum(StepState, workflows_pb2.StepState, "STEP_STATE")
RUN_ACTION = WireEnum(RunAction, runs_pb2.RunAction, "RUN_ACTION")
JOB_ACTION = WireEnum(JobAction, jobs_pb2.JobAction, "JOB_ACTION")
BACKFILL_MODE = WireEnum(BackfillMode, jobs_pb2.BackfillMode, "BACKFILL_MODE")

# What a worker may report, by its wire value. The rest of AttemptOutcome is the node's to decide;
# anything else a worker sends (unspecified, one of those, a number this version does not know)
# counts as failed, so a confused worker's run is retried by its policy rather than lost.
WORKER_OUTCOMES: dict[int, AttemptOutcome] = {ATTEMPT_OUTCOME.number(outcome): outcome for outcome in (
    AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.PERMANENT_FAILURE,
    AttemptOutcome.TIMED_OUT, AttemptOutcome.CANCELLED,
)}


def reported_outcome(number: int) -> AttemptOutcome:
    """The outcome a worker's result stands for (see :data:`WORKER_OUTCOMES`)."""
    return WORKER_OUTCOMES.get(number, AttemptOutcome.FAILED)


ALL = (JOB_STATE, RUN_STATE, ATTEMPT_OUTCOME, OVERLAP_POLICY, MISFIRE_KIND, DELIVERY, ROLE, AUDIT_ACTION,
       AUDIT_TARGET, WORKFLOW_RUN_STATE, STEP_STATE, BACKFILL_MODE)
