"""What a store does for a backfill (:mod:`fastlane.domain.backfill`), and what it answers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fastlane.domain.backfill import Occurrence
from fastlane.domain.models import Run


@dataclass(frozen=True, slots=True)
class BackfillWrite:
    """What one part of a backfill wrote (or, in a dry run, would write)."""

    written: int = 0
    already_run: int = 0  # fire times with a run that ran (or is to run): none written for them
    beyond: int = 0  # fire times at or after the job's next one: the schedule's own, none written
    # Runs free to start now (allow; under buffer_all the one released): the node must hear of them.
    scheduled: list[Run] = field(default_factory=list)


class BackfillStore(Protocol):
    async def write_backfill(
        self, tenant: str, job_id: str, backfill_id: str, occurrences: Sequence[Occurrence], *,
        missed_only: bool, buffered: bool, dry_run: bool,
    ) -> BackfillWrite:
        """Write a run named ``backfill_id`` for each of ``occurrences`` (buffered, or scheduled
        now), in the job's lock, leaving out those at or after the job's next fire time (the
        schedule runs those) and, with ``missed_only``, those that have a run other than a
        skipped one; with ``dry_run`` count them and write nothing. Raises :class:`JobNotFound`
        if the tenant has no such job."""
        ...
