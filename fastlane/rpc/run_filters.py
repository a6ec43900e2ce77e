"""A filter of runs from the wire (ListRuns, and the selection of ActOnRuns): validated once.

The filters combine. A state entry that is unspecified adds nothing (a filter's unspecified is
any); an unknown one is refused with its index; a reversed time range is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from fastlane.domain import validation
from fastlane.domain.models import RunState
from fastlane.domain.records import RunFilter
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire
from fastlane.rpc.enums import RUN_STATE


def run_filter_in(
    field: str,
    *,
    job_id: str = "",
    job_type: str = "",
    states: Sequence[int] = (),
    scheduled_from: Timestamp | None = None,
    scheduled_before: Timestamp | None = None,
) -> RunFilter:
    """The filter these fields of a request give; ``field`` prefixes their names in errors
    (``""`` for a request's own fields, ``"selection."`` for a nested message's). A timestamp
    left unset is passed as None."""
    if len(states) > len(RunState):
        raise InvalidArgument(f"{field}states", f"at most {len(RunState)} states may be given")
    members = frozenset(RUN_STATE.member(state, f"{field}states[{index}]") for index, state in enumerate(states) if state)
    begins = wire.instant_in(f"{field}scheduled_from", scheduled_from) if scheduled_from is not None else None
    ends = wire.instant_in(f"{field}scheduled_before", scheduled_before) if scheduled_before is not None else None
    if begins is not None and ends is not None and ends <= begins:
        raise InvalidArgument(f"{field}scheduled_before", "must be later than scheduled_from")
    return RunFilter(
        job_id=validation.identifier(f"{field}job_id", job_id, required=False) or None,
        job_type=validation.name(f"{field}job_type", job_type) if job_type else None,
        states=members, scheduled_from=begins, scheduled_before=ends,
    )
