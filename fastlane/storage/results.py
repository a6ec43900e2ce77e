"""What a store's writes did, as the engine needs to know it."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastlane.domain.models import Job, Run, RunState, queue_of
from fastlane.storage import codec


class ResultOutcome:
    """What recording a result did to a run: ``accepted`` is False for a superseded attempt.

    ``released`` marks a run of the same job that left the overlap buffer because this one
    finished: it is now ``scheduled`` and due at once.

    A store may hand over the run's row rather than the run: the node needs only ``state`` for
    most results (a success), and building a full run for each of thousands of results a second
    would be CPU spent for nothing. ``run`` is then built when first asked for.
    """

    __slots__ = ("accepted", "released", "_run", "_row")

    def __init__(
        self, *, accepted: bool, released: bool = False, run: Run | None = None, row: codec.Row | None = None
    ) -> None:
        if (run is None) == (row is None):
            raise ValueError("a result outcome needs the run or its row")
        self.accepted = accepted
        self.released = released
        self._run = run
        self._row = row

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = codec.build_run(self._held_row())
        return self._run

    @property
    def state(self) -> RunState:
        return self._run.state if self._run is not None else codec.run_state(self._held_row())

    @property
    def queue(self) -> tuple[str, str]:
        """The run's (job type, tenant), read without building the run."""
        if self._run is not None:
            return queue_of(self._run.job_type, self._run.tenant)
        row = self._held_row()
        return queue_of(row["job_type"], row["tenant"])

    @property
    def workflow_run_id(self) -> str | None:
        """The workflow run of a step run (None for other runs), read without building the run."""
        return self._run.workflow_run_id if self._run is not None else codec.optional_column(self._held_row(), "workflow_run_id")

    def _held_row(self) -> codec.Row:
        assert self._row is not None  # the constructor took one of the two
        return self._row

    def __repr__(self) -> str:
        return f"ResultOutcome(run={self.run!r}, accepted={self.accepted}, released={self.released})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Materialised:
    """What a materialisation wrote.

    ``runs``: the new runs in state ``scheduled``, to release at their time. ``cancelling``:
    earlier runs an overlap policy cancelled — queued ones now ``cancelled`` (drop them from
    memory), delivered ones ``cancel_requested`` (tell their workers to stop).
    """

    runs: list[Run]
    advanced: frozenset[str] = frozenset()  # jobs whose next_fire_at this write moved on
    cancelling: list[Run] = field(default_factory=list)
    # Jobs of the batch that were not advanced because they changed meanwhile (elsewhere), as
    # they are now: the caller replaces its stale copy with these.
    changed: list[Job] = field(default_factory=list)
    # Occurrences recorded as skipped, by the policy that skipped them: misfire or overlap.
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancellation:
    """What cancelling a run did: ``run`` as it is now, ``released`` runs to schedule at once;
    ``already``: it was cancelled before, or its cancel requested, and nothing changed (a cancel
    is idempotent, as a pause is)."""

    run: Run
    released: list[Run] = field(default_factory=list)
    already: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TrimmedHistory:
    """What one ``trim_history`` batch did: ``runs`` deleted (with their attempts), and how long
    the database was busy with it, from the start of its transaction to its commit (time spent
    waiting for a connection or, on SQLite, for the writer's turn left out): what a trimmer paces
    itself by."""

    runs: int
    busy_seconds: float
