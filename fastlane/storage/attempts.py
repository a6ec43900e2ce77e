"""What the dispatch journal asks of a store: dispatches, heartbeats and results of attempts,
each kind alone or a whole journal round at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fastlane.domain.models import Attempt
from fastlane.domain.records import AttemptResult, CappedDispatches, Dispatch, Heartbeat
from fastlane.storage.late_reports import ReporterOf
from fastlane.storage.results import ResultOutcome


@dataclass(frozen=True, slots=True)
class RoundWritten:
    """What one journal round wrote: as the three calls it stands for would each have answered."""

    attempts: list[Attempt]  # the dispatches' (record_dispatches)
    stale: list[str]  # the heartbeats' (record_heartbeats)
    outcomes: list[ResultOutcome]  # the results' (record_results)


class AttemptStore(Protocol):
    """What the dispatch journal records: dispatches, heartbeats and results of attempts."""

    async def record_dispatches(self, dispatches: Sequence[Dispatch]) -> list[Attempt]:
        """Start an attempt for each run still ``scheduled``; others are ignored (and not returned)."""
        ...

    async def record_capped_dispatches(self, dispatches: Sequence[Dispatch]) -> CappedDispatches:
        """As :meth:`record_dispatches`, for runs with a concurrency key (``Dispatch.cap``): in
        the same transaction, under a lock per key, a run is started only while fewer than its
        limit of its key's runs are ``dispatched`` or ``running``; the others stay ``scheduled``
        and come back in ``blocked``, in the order given. Runs are admitted in the order given."""
        ...

    async def record_heartbeats(self, heartbeats: Sequence[Heartbeat]) -> list[str]:
        """Extend leases; return the run ids whose attempt is no longer current (worker should stop)."""
        ...

    async def record_results(
        self, results: Sequence[AttemptResult], *, reporter_of: ReporterOf | None = None
    ) -> list[ResultOutcome]:
        """Apply the results of current attempts; record stale ones as superseded. With
        ``reporter_of``, a result whose attempt has no row (its node died before recording the
        dispatch) is recorded as an attempt of its own: see :mod:`fastlane.storage.late_reports`."""
        ...

    async def record_round(
        self, dispatches: Sequence[Dispatch], heartbeats: Sequence[Heartbeat], results: Sequence[AttemptResult], *,
        reporter_of: ReporterOf | None = None,
    ) -> RoundWritten:
        """What :meth:`record_dispatches`, :meth:`record_heartbeats` and :meth:`record_results`
        do, in that order, in one transaction: all of it lands or none of it does."""
        ...
