"""Filters of runs and jobs from the wire (ListRuns, the selections of ActOnRuns and ActOnJobs):
validated once.

The filters combine. A state entry that is unspecified adds nothing (a filter's unspecified is
any); an unknown one is refused with its index; a reversed time range is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from fastlane.domain import validation
from fastlane.domain.models import JobState, RunState
from fastlane.domain.records import JobFilter, RunFilter
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire
from fastlane.rpc.enums import JOB_STATE, RUN_STATE, WireEnum


def run_filter_in(
    field: str,
    *,
    job_id: str = "",
    job_type: str = "",
    states: Sequence[int] = (),
    scheduled_from: Timestamp | None = None,
    scheduled_before: Timestamp | None = None,
    backfill_id: str = "",
) -> RunFilter:
    """The filter these fields of a request give; ``field`` prefixes their names in errors
    (``""`` for a request's own fields, ``"selection."`` for a nested message's). A timestamp
    left unset is passed as None."""
    members = _states_in(RUN_STATE, len(RunState), f"{field}states", states)
    begins = wire.instant_in(f"{field}scheduled_from", scheduled_from) if scheduled_from is not None else None
    ends = wire.instant_in(f"{field}scheduled_before", scheduled_before) if scheduled_before is not None else None
    if begins is not None and ends is not None and ends <= begins:
        raise InvalidArgument(f"{field}scheduled_before", "must be later than scheduled_from")
    return RunFilter(
        job_id=validation.identifier(f"{field}job_id", job_id, required=False) or None,
        job_type=validation.name(f"{field}job_type", job_type) if job_type else None,
        states=members, scheduled_from=begins, scheduled_before=ends,
        backfill_id=validation.identifier(f"{field}backfill_id", backfill_id, required=False) or None,
    )


def job_filter_in(field: str, *, job_type: str = "", states: Sequence[int] = ()) -> JobFilter:
    """The filter of jobs these fields give (``field`` as in :func:`run_filter_in`)."""
    return JobFilter(job_type=validation.name(f"{field}job_type", job_type) if job_type else None,
                     states=_states_in(JOB_STATE, len(JobState), f"{field}states", states))


def _states_in(values: WireEnum[Any, Any], most: int, field: str, states: Sequence[int]) -> frozenset[Any]:
    if len(states) > most:
        raise InvalidArgument(field, f"at most {most} states may be given")
    return frozenset(values.member(state, f"{field}[{index}]") for index, state in enumerate(states) if state)
