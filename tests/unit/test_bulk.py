"""A bulk action's loop (:mod:`fastlane.engine.bulk`) over a store that pages a fixed list of runs
or jobs: the limit, the pages, items changed meanwhile, a quota that stops the call and where it
resumes."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fastlane.domain.errors import InvalidState, JobNotFound, QuotaExceeded
from fastlane.domain.models import Delivery, Job, JobSpec, JobState, Run, RunState, Schedule
from fastlane.domain.records import JobAction, JobFilter, Page, RunAction, RunFilter
from fastlane.engine import bulk

BASE = datetime(2027, 1, 1, tzinfo=UTC)


def run(index: int, state: RunState = RunState.DEAD) -> Run:
    return Run(run_id=f"run-{index:04d}", job_id="job", tenant="t", job_type="billing", shard_id=0,
               scheduled_for=BASE + timedelta(seconds=index), available_at=BASE, state=state, attempts=1, payload=b"",
               priority=0, manual=False, delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30),
               created_at=BASE, updated_at=BASE)


@dataclass
class PagedRuns:
    """The store's runs as bulk uses them: newest first, pages by an index token."""

    runs: list[Run]
    asked: list[dict[str, Any]] = field(default_factory=list)

    async def list_runs(self, tenant: str, *, states: Collection[RunState] = (), limit: int = 100,
                        page_token: str = "", **filters: Any) -> Page[Run]:
        self.asked.append({"tenant": tenant, "states": frozenset(states), "limit": limit, "token": page_token, **filters})
        newest_first = sorted((r for r in self.runs if r.state in states), key=lambda r: r.scheduled_for, reverse=True)
        start = int(page_token) if page_token else 0
        items = newest_first[start:start + limit]
        more = len(newest_first) > start + limit
        return Page(items=items, next_page_token=str(start + limit) if more else "")

    def page_token_after(self, run: Run) -> str:
        newest_first = sorted(self.runs, key=lambda r: r.scheduled_for, reverse=True)
        return str(newest_first.index(run) + 1)

    async def count_runs(self, tenant: str, selection: RunFilter) -> int:
        self.asked.append({"count": selection})
        return sum(1 for r in self.runs if selection.matches(r))


@dataclass
class PagedJobs:
    """The store's jobs as bulk uses them: in id order, pages by the last id."""

    jobs: list[Job]
    asked: list[dict[str, Any]] = field(default_factory=list)

    async def list_jobs(self, tenant: str, *, states: Collection[JobState] = (), job_type: str | None = None,
                        limit: int = 100, page_token: str = "") -> Page[Job]:
        self.asked.append({"states": frozenset(states), "job_type": job_type, "limit": limit, "token": page_token})
        selection = JobFilter(job_type=job_type, states=frozenset(states))
        after = sorted((j for j in self.jobs if j.job_id > page_token and selection.matches(j)), key=lambda j: j.job_id)
        items = after[:limit]
        return Page(items=items, next_page_token=items[-1].job_id if len(after) > limit else "")

    async def count_selected_jobs(self, tenant: str, selection: JobFilter) -> int:
        self.asked.append({"count": selection})
        return sum(1 for j in self.jobs if selection.matches(j))


@dataclass
class FakeStore:
    runs: PagedRuns
    jobs: PagedJobs = field(default_factory=lambda: PagedJobs([]))


def store_of(runs: list[Run], jobs: Sequence[Job] = ()) -> Any:
    return FakeStore(PagedRuns(runs), PagedJobs(list(jobs)))


def job(index: int, state: JobState = JobState.ACTIVE, job_type: str = "billing") -> Job:
    spec = JobSpec(name=f"job-{index}", job_type=job_type, schedule=Schedule.interval(timedelta(hours=1)), tenant="t")
    return Job(job_id=f"job-{index:04d}", spec=spec, state=state, next_fire_at=BASE, version=1, shard_id=0,
               created_at=BASE, updated_at=BASE)


async def test_a_call_acts_on_at_most_its_limit_a_page_at_a_time_and_returns_where_to_go_on() -> None:
    store = store_of([run(index) for index in range(450)])
    acted: list[str] = []

    async def verb(tenant: str, run_id: str) -> bool:
        acted.append(run_id)
        return True

    first = await bulk.act_on_runs(store, "t", RunAction.RETRY, RunFilter(), verb=verb, dry_run=False, limit=300)
    assert (first.matched, first.acted, first.skipped) == (300, 300, 0)
    assert first.next_page_token and not first.stopped_because
    assert [asked["limit"] for asked in store.runs.asked] == [bulk.PAGE, 100]  # never more than is left
    assert {asked["states"] for asked in store.runs.asked} == {frozenset({RunState.DEAD, RunState.LOST})}
    rest = await bulk.act_on_runs(store, "t", RunAction.RETRY, RunFilter(), verb=verb, dry_run=False, limit=300,
                                  page_token=first.next_page_token)
    assert (rest.matched, rest.acted, rest.next_page_token) == (150, 150, "")
    assert sorted(acted) == sorted(r.run_id for r in store.runs.runs)  # each once, none twice


async def test_runs_changed_since_their_page_was_read_are_counted_as_skipped() -> None:
    store = store_of([run(index) for index in range(5)])

    async def verb(tenant: str, run_id: str) -> bool:
        if run_id == "run-0001":
            raise InvalidState("run", run_id, "scheduled", "retry")
        return run_id != "run-0002"  # nothing left to do for this one

    outcome = await bulk.act_on_runs(store, "t", RunAction.RETRY, RunFilter(), verb=verb, dry_run=False, limit=100)
    assert (outcome.matched, outcome.acted, outcome.skipped, outcome.next_page_token) == (5, 3, 2, "")


async def test_a_quota_refusal_stops_the_call_after_the_last_run_it_took() -> None:
    store = store_of([run(index) for index in range(bulk.PAGE + 50)])
    admitted = 0

    async def admit(tenant: str) -> None:
        nonlocal admitted
        if admitted == bulk.PAGE + 10:
            raise QuotaExceeded("tenant 't' has 5 runs waiting")
        admitted += 1

    async def verb(tenant: str, run_id: str) -> bool:
        return True

    outcome = await bulk.act_on_runs(store, "t", RunAction.RETRY, RunFilter(), verb=verb, dry_run=False, limit=1000,
                                     admit=admit)
    assert (outcome.matched, outcome.acted) == (bulk.PAGE + 10, bulk.PAGE + 10)
    assert outcome.stopped_because == "tenant 't' has 5 runs waiting"
    assert outcome.next_page_token == str(bulk.PAGE + 10)  # on from the first run not taken


async def test_a_quota_refusal_before_any_run_refuses_the_call() -> None:
    store = store_of([run(index) for index in range(3)])

    async def admit(tenant: str) -> None:
        raise QuotaExceeded("tenant 't' has 5 runs waiting")

    async def verb(tenant: str, run_id: str) -> bool:
        raise AssertionError("refused before any run")

    with pytest.raises(QuotaExceeded):
        await bulk.act_on_runs(store, "t", RunAction.RETRY, RunFilter(), verb=verb, dry_run=False, limit=10,
                               admit=admit)


async def test_a_dry_run_counts_the_states_the_action_takes_within_the_selection_and_acts_on_none() -> None:
    runs = [run(0, RunState.SCHEDULED), run(1, RunState.RUNNING), run(2, RunState.DEAD), run(3, RunState.SUCCEEDED)]
    store = store_of(runs)

    async def verb(tenant: str, run_id: str) -> bool:
        raise AssertionError("a dry run acts on nothing")

    cancel = await bulk.act_on_runs(store, "t", RunAction.CANCEL, RunFilter(), verb=verb, dry_run=True, limit=10)
    assert (cancel.matched, cancel.acted) == (2, 0)
    only_running = RunFilter(states=frozenset({RunState.RUNNING, RunState.SUCCEEDED}))
    narrowed = await bulk.act_on_runs(store, "t", RunAction.CANCEL, only_running, verb=verb, dry_run=True, limit=10)
    assert narrowed.matched == 1  # succeeded is not the cancel's to take
    none = RunFilter(states=frozenset({RunState.SUCCEEDED}))
    assert (await bulk.act_on_runs(store, "t", RunAction.RETRY, none, verb=verb, dry_run=False, limit=10)).matched == 0


@pytest.mark.parametrize(("field", "value", "taken"), [
    ("job_id", "other", False), ("job_type", "billing", True), ("job_type", "other", False),
    ("scheduled_from", BASE + timedelta(seconds=2), False), ("scheduled_before", BASE + timedelta(seconds=2), True),
])
def test_a_filter_takes_a_run_only_when_every_field_set_matches(field: str, value: object, taken: bool) -> None:
    assert RunFilter(**{field: value}).matches(run(1)) is taken  # type: ignore[arg-type]


async def test_a_job_action_takes_the_states_its_verb_may_change_page_by_page_and_skips_jobs_gone_meanwhile() -> None:
    jobs = [job(index) for index in range(bulk.PAGE + 20)]
    jobs += [job(900, JobState.PAUSED), job(901, JobState.ERRORED), job(902, JobState.ACTIVE, "other")]
    store = store_of([], jobs)
    paused: list[str] = []

    async def pause(tenant: str, listed: Job) -> bool:
        if listed.job_id == "job-0003":
            raise JobNotFound(listed.job_id)  # deleted since its page was read
        paused.append(listed.job_id)
        return True

    billing = JobFilter(job_type="billing")
    counted = await bulk.act_on_jobs(store, "t", JobAction.PAUSE, billing, verb=pause, dry_run=True, limit=10)
    assert (counted.matched, paused) == (bulk.PAGE + 20, [])
    first = await bulk.act_on_jobs(store, "t", JobAction.PAUSE, billing, verb=pause, dry_run=False, limit=bulk.PAGE + 5)
    assert (first.matched, first.acted, first.skipped) == (bulk.PAGE + 5, bulk.PAGE + 4, 1)
    assert [asked["limit"] for asked in store.jobs.asked[1:]] == [bulk.PAGE, 5]
    assert {asked["states"] for asked in store.jobs.asked[1:]} == {frozenset({JobState.ACTIVE})}
    rest = await bulk.act_on_jobs(store, "t", JobAction.PAUSE, billing, verb=pause, dry_run=False, limit=1000,
                                  page_token=first.next_page_token)
    assert (rest.matched, rest.next_page_token) == (15, "")
    assert sorted(paused) == [j.job_id for j in jobs[:bulk.PAGE + 20] if j.job_id != "job-0003"]


async def test_a_job_action_given_states_it_cannot_change_takes_none() -> None:
    store = store_of([], [job(0, JobState.PAUSED), job(1, JobState.ERRORED), job(2, JobState.COMPLETED)])

    async def verb(tenant: str, listed: Job) -> bool:
        return True

    active_or_completed = JobFilter(states=frozenset({JobState.ACTIVE, JobState.COMPLETED}))
    assert (await bulk.act_on_jobs(store, "t", JobAction.RESUME, active_or_completed, verb=verb, dry_run=True,
                                   limit=10)).matched == 0
    assert store.jobs.asked == []  # refused before the store is asked
    resumed = await bulk.act_on_jobs(store, "t", JobAction.RESUME, JobFilter(), verb=verb, dry_run=False, limit=10)
    assert (resumed.matched, resumed.acted) == (2, 2)  # paused and errored; completed is not resume's
    deleted = await bulk.act_on_jobs(store, "t", JobAction.DELETE, JobFilter(), verb=verb, dry_run=True, limit=10)
    assert deleted.matched == 3  # a delete takes every state
