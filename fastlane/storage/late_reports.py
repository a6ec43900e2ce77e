"""Results of attempts the database never heard of: their node sent them, then died.

A node sends a run to a worker first and records the dispatch a few milliseconds later (the fast
lane). If it dies in between, the worker still runs the attempt and reports it, to another node,
with a lease token no attempt row carries. Dropped, such a report would leave history showing
one attempt where workers had run two, so it is recorded as an attempt of its own
(``reported_late``), with the reporting worker and the times it gives:

- If the run is still waiting for its first delivery as far as the database knows (``scheduled``,
  due within the longest send-ahead), the reported attempt *is* that delivery: it becomes the run's current attempt and its result applies
  as any result does. The run is not sent again (a copy the new owner already released is
  withdrawn when its dispatch finds the run no longer scheduled).
- Otherwise (the run was sent again meanwhile, or has ended) the attempt is recorded with the
  outcome the worker gave and does not change the run; every other attempt of the run that had
  not finished when it started is marked ``redelivery``: the run went out twice.

Only a worker allowed to see the run's tenant can have its report recorded this way. A
``cancelled`` report is not: a node stopped that attempt (withdrawn before its instant because its
dispatch was refused, or found stale by a node that never sent it), mostly before the handler
began, and the run goes out again as it would have anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from fastlane.domain.limits import MAX_SEND_AHEAD
from fastlane.domain.models import Attempt, AttemptOutcome, Run, RunState
from fastlane.domain.records import AttemptResult
from fastlane.storage.results import ResultOutcome

ReportKey = tuple[str, int]  # (run_id, lease_token)


@dataclass(frozen=True, slots=True)
class Reporter:
    """Who reported a result: the worker, the node recording it, and the worker's tenant scope
    (``None``: a worker that serves every tenant)."""

    worker_id: str
    node_id: str
    tenant: str | None


ReporterOf = Callable[[str, int], "Reporter | None"]  # (run_id, lease_token) -> who reported it


@dataclass(slots=True)
class LatePlan:
    """What to write for late reports, and what the rest of the result path must know."""

    rows: list[Attempt] = field(default_factory=list)  # attempt rows to insert
    # Runs as they are once the reported attempt is their current one: the caller decides these
    # results as usual, against these runs.
    adopted: dict[str, Run] = field(default_factory=dict)
    # (run_id, late attempt number, its start): mark the run's other attempts not finished by then.
    redeliveries: list[tuple[str, int, datetime]] = field(default_factory=list)
    outcomes: list[ResultOutcome] = field(default_factory=list)  # reports recorded, runs unchanged
    recorded: set[ReportKey] = field(default_factory=set)  # every report this plan takes

    @property
    def adopted_keys(self) -> set[ReportKey]:
        return {(run.run_id, run.lease_token or 0) for run in self.adopted.values()}


def plan_late_reports(
    runs: Mapping[str, Run], unrecorded: Sequence[AttemptResult], reporter_of: ReporterOf, now: datetime
) -> LatePlan:
    """Decide what to record for results whose attempt has no row (see the module's rules).

    ``runs``: the reported runs as read in the caller's transaction. A report without a known
    reporter, or for a run the reporter may not see, is left out: it is decided as before (a
    stale result, nothing recorded).
    """
    plan = LatePlan()
    numbered: dict[str, int] = {}  # a run's attempt count so far, counting late rows made here
    for result in unrecorded:
        key = (result.run_id, result.lease_token)
        run = runs.get(result.run_id)
        reporter = reporter_of(*key)
        if run is None or reporter is None or key in plan.recorded or result.outcome is AttemptOutcome.CANCELLED:
            continue
        if reporter.tenant is not None and reporter.tenant != run.tenant:
            continue
        number = numbered.get(run.run_id, run.attempts) + 1
        numbered[run.run_id] = number
        plan.recorded.add(key)
        began = min(t for t in (result.started_at, result.finished_at, now) if t is not None)
        adopt = (run.run_id not in plan.adopted and run.state is RunState.SCHEDULED
                 and run.available_at <= now + MAX_SEND_AHEAD)
        plan.rows.append(Attempt(
            run_id=run.run_id, attempt=number, lease_token=result.lease_token, worker_id=reporter.worker_id,
            node_id=reporter.node_id, outcome=AttemptOutcome.PENDING if adopt else result.outcome,
            dispatched_at=began, started_at=result.started_at,
            finished_at=None if adopt else (result.finished_at or now),
            error_code=None if adopt else result.error_code, error_message=None if adopt else result.error_message,
            error_traceback=None if adopt else result.error_traceback, reported_late=True,
        ))
        if adopt:
            plan.adopted[run.run_id] = replace(run, state=RunState.DISPATCHED, lease_token=result.lease_token,
                                               attempts=number, worker_id=reporter.worker_id)
        else:
            plan.redeliveries.append((run.run_id, number, result.started_at or began))
            plan.outcomes.append(ResultOutcome(run=run, accepted=False))
    return plan


def settle_plan(
    plan: LatePlan, runs: dict[str, Run], results: Sequence[AttemptResult], outcomes: list[ResultOutcome]
) -> list[AttemptResult]:
    """Once the plan is written: adopted runs replace theirs in ``runs``, the outcomes of reports
    recorded without changing their run join ``outcomes``; returns the results the usual
    decision still takes (all but those)."""
    runs.update(plan.adopted)
    outcomes += plan.outcomes
    adopted = plan.adopted_keys
    return [r for r in results if (key := (r.run_id, r.lease_token)) not in plan.recorded or key in adopted]


def unrecorded(results: Sequence[AttemptResult], recorded_keys: set[ReportKey]) -> list[AttemptResult]:
    """The results whose attempt has no row (``recorded_keys``: the attempts of their runs)."""
    return [r for r in results if (r.run_id, r.lease_token) not in recorded_keys]
