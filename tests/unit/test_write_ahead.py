"""When the materialiser writes planned jobs: a lead before they are due, earlier for a crowd."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from fastlane.domain.models import DueJob, MisfirePolicy, Timing, queue_of
from fastlane.engine.backlog import MIN_BACKLOG, PACE_WINDOW
from fastlane.engine.dispatch.reserve import PriorityReserve
from fastlane.engine.write_ahead import (
    BACKLOG_RECHECK,
    FAR_FUTURE,
    PLAN_SLICE,
    SLOT,
    WriteAhead,
    _slot,
    adaptive_lead,
    catch_up_through,
    write_start,
)
from fastlane.runtime.metrics import Metrics
from fastlane.server.settings import Settings
from fastlane.testing import ManualClock

LEAD = timedelta(milliseconds=250)
T = datetime(2027, 3, 1, 9, 30, tzinfo=UTC)  # at a slot boundary


def test_nothing_planned_means_nothing_to_write():
    assert write_start({}, LEAD, 5_000.0) == (FAR_FUTURE, FAR_FUTURE)


def test_a_lone_job_is_written_a_lead_before_its_slot_with_its_slot():
    start, through = write_start({_slot(T + timedelta(milliseconds=40)): 1}, LEAD, 1_000.0)
    assert start == T - LEAD - timedelta(milliseconds=1)
    assert through == T + SLOT


def test_steady_load_takes_one_slot_at_a_time():
    # 100 jobs in each of the next 50 slots, written at 5,000 a second: the first slot decides.
    planned = {_slot(T) + index: 100 for index in range(50)}
    start, through = write_start(planned, LEAD, 5_000.0)
    assert start == T - LEAD - timedelta(milliseconds=20)
    assert through == T + SLOT


def test_a_crowd_is_started_early_enough_to_be_written_before_its_lead():
    crowd_at = T + timedelta(seconds=3)
    planned = {_slot(T) + index: 10 for index in range(5)}  # a few jobs first
    planned[_slot(crowd_at)] = 100_000
    start, through = write_start(planned, LEAD, 20_000.0)
    # Everything up to the crowd (100,050 jobs) takes 5.0025 s to write.
    assert start == crowd_at - LEAD - timedelta(seconds=100_050 / 20_000)
    assert through == crowd_at + SLOT


def test_a_slower_writer_starts_a_crowd_earlier():
    planned = {_slot(T): 10_000}
    fast, _ = write_start(planned, LEAD, 10_000.0)
    slow, _ = write_start(planned, LEAD, 2_000.0)
    assert fast - slow == timedelta(seconds=4)


def test_the_write_lead_grows_with_slow_writes_within_its_floor_and_cap() -> None:
    floor, cap = timedelta(milliseconds=250), timedelta(seconds=2)
    assert adaptive_lead(floor, [], cap) == floor
    assert adaptive_lead(floor, [0.01, 0.05], cap) == floor  # 3 x 50 ms is under the floor
    assert adaptive_lead(floor, [0.01, 0.2, 0.05], cap) == timedelta(milliseconds=600)  # 3 x the slowest
    assert adaptive_lead(floor, [5.0], cap) == cap
    assert adaptive_lead(timedelta(seconds=3), [5.0], cap) == timedelta(seconds=3)  # the floor wins over the cap


def test_on_time_a_batch_takes_the_slot_write_start_chose():
    planned = {_slot(T) + index: 100 for index in range(50)}
    start, through = write_start(planned, LEAD, 5_000.0)
    assert catch_up_through(through, start, LEAD) == through


def test_behind_a_batch_takes_everything_that_should_be_written_by_now():
    # The writer woke 400 ms late: four slots are overdue and the next 250 ms are due within the lead.
    planned = {_slot(T) + index: 100 for index in range(50)}
    start, through = write_start(planned, LEAD, 5_000.0)
    late = start + timedelta(milliseconds=400)
    assert through == T + SLOT
    assert catch_up_through(through, late, LEAD) == late + LEAD


# -- holding the jobs of a queue over its backlog -------------------------------------------------

NOISY, QUIET = queue_of("t", "noisy"), queue_of("t", "quiet")


def _deferring_write_ahead(
    clock: ManualClock, backlogs: dict[tuple[str, str], int], limit: int,
    assigned: dict[tuple[str, str], int] | None = None, reserve: PriorityReserve | None = None,
) -> WriteAhead:
    settings = Settings(db_url="sqlite:///unused.db", max_backlog=limit, priority_reserve=reserve)
    return WriteAhead(
        None,  # type: ignore[arg-type]  # nothing here writes
        settings=settings, clock=clock, metrics=Metrics(),
        fencing=_NoShards(), release=_NoRelease(), load=_Load(backlogs, assigned), stopping=asyncio.Event(),
    )


class _NoShards:
    def fence(self, shard_id: int) -> None:
        return None

    def stale(self, shard_id: int, fence_token: int, why: str) -> None:
        pass


class _NoRelease:
    def schedule_run(self, run: object) -> None:
        pass

    def cancel_runs(self, runs: object) -> None:
        pass

    def written_ahead(self) -> int:
        return 0


class _Load:
    def __init__(self, backlogs: dict[tuple[str, str], int], assigned: dict[tuple[str, str], int] | None) -> None:
        self._backlogs, self._assigned = backlogs, assigned

    def backlogs(self) -> dict[tuple[str, str], int]:
        return self._backlogs

    def assigned_totals(self) -> dict[tuple[str, str], int]:
        return dict(self._assigned or {})


def _due(job_id: str, queue: tuple[str, str], ms_before: int, priority: int = 0) -> DueJob:
    return DueJob(job_id, 0, T - timedelta(milliseconds=ms_before), Timing(None, MisfirePolicy()), queue, priority)


async def test_a_queue_below_its_limit_gets_back_only_the_room_it_has_oldest_first_and_paced():
    backlogs = {NOISY: 10}
    ahead = _deferring_write_ahead(ManualClock(T), backlogs, limit=10)
    # Names unlike their order: the oldest is the one that fell due first.
    noisy = [_due(name, NOISY, 900 - 10 * index) for index, name in enumerate("hgfedcba")]
    for job in [*reversed(noisy), _due("q0", QUIET, 900)]:
        ahead._plan(job)
    recheck = BACKLOG_RECHECK.total_seconds()

    holding = ahead._look_at_backlogs(0.0)
    assert holding == {NOISY}
    assert [job.job_id for job in ahead._pop_planned(T, holding)] == ["q0"]  # the quiet queue is written
    assert ahead.deferred == 8

    backlogs[NOISY] = 7  # room for 3: the three that fell due first come back, the rest wait
    holding = ahead._look_at_backlogs(recheck)
    assert holding == {NOISY}  # it still holds jobs: any falling due now line up behind them
    assert [job.job_id for job in ahead._pop_planned(T, holding)] == ["h", "g", "f"]
    assert ahead.deferred == 5

    backlogs[NOISY] = 0  # room for all, but not before the next look
    holding = ahead._look_at_backlogs(recheck * 1.5)
    assert ahead._pop_planned(T, holding) == [] and ahead.deferred == 5
    holding = ahead._look_at_backlogs(recheck * 2)
    assert [job.job_id for job in ahead._pop_planned(T, holding)] == ["e", "d", "c", "b", "a"]
    assert ahead.deferred == 0 and ahead._look_at_backlogs(recheck * 3) == frozenset()


async def test_jobs_given_back_and_not_yet_written_count_against_the_room_and_new_ones_wait_behind():
    backlogs = {NOISY: 10}
    ahead = _deferring_write_ahead(ManualClock(T), backlogs, limit=10)
    for index in range(6):
        ahead._plan(_due(f"old-{index}", NOISY, 900 - index))
    ahead._pop_planned(T, ahead._look_at_backlogs(0.0))
    assert ahead.deferred == 6

    backlogs[NOISY] = 8  # room for 2, given back but not written before the next look
    ahead._look_at_backlogs(1.0)
    ahead._plan(_due("new", NOISY, 1))  # falls due now, after the deferred ones
    ahead._look_at_backlogs(2.0)  # the backlog has not moved: no more room than the 2 already given
    assert ahead.deferred == 4
    taken = ahead._pop_planned(T, ahead._look_at_backlogs(2.0))
    assert [job.job_id for job in taken] == ["old-0", "old-1"]
    assert ahead.deferred == 5  # "new" was deferred behind the four still waiting
    backlogs[NOISY] = 0
    ahead._look_at_backlogs(3.0)
    assert [job.job_id for job in ahead._pop_planned(T, frozenset())] == ["old-2", "old-3", "old-4", "old-5", "new"]


async def test_a_queue_is_deferred_at_a_few_seconds_of_its_pace_well_below_max_backlog():
    # The noisy queue's workers take 100 runs a second: at the default 2 s of pace its limit is
    # the floor, MIN_BACKLOG, not --max-backlog's 10,000; the quiet queue, as fast as it is due,
    # is not deferred at the same depth.
    assigned = {NOISY: 0, QUIET: 0}
    backlogs = {NOISY: MIN_BACKLOG, QUIET: MIN_BACKLOG - 1}
    ahead = _deferring_write_ahead(ManualClock(T), backlogs, limit=10_000, assigned=assigned)
    ahead._look_at_backlogs(0.0)  # the first reading: no pace yet
    assigned.update({NOISY: 100, QUIET: 100})
    assert ahead._look_at_backlogs(PACE_WINDOW) == {NOISY}

    assigned.update({NOISY: 200, QUIET: 5_100})  # the quiet queue's workers now take 5,000 a second
    backlogs.update({NOISY: MIN_BACKLOG - 1, QUIET: 9_999})
    assert ahead._look_at_backlogs(2 * PACE_WINDOW) == frozenset()  # 2 s of 5,000/s: 10,000
    backlogs[QUIET] = 10_000
    assert ahead._look_at_backlogs(2 * PACE_WINDOW) == {QUIET}  # --max-backlog still bounds it


async def test_urgent_jobs_are_not_deferred_by_the_pace_only_by_max_backlog():
    # Runs of the --priority-reserve priority take credits kept for them: they would not wait
    # behind the backlog, so holding them would only make them late. But a client picks its
    # priority: past --max-backlog itself they are deferred like the rest.
    backlogs = {NOISY: MIN_BACKLOG}  # over its limit by the pace (the floor), far below --max-backlog
    ahead = _deferring_write_ahead(ManualClock(T), backlogs, limit=10_000, reserve=PriorityReserve(priority=100, credits=2))
    for job in [_due("low", NOISY, 900, priority=-1000), _due("high", NOISY, 800, priority=100),
                _due("higher", NOISY, 700, priority=1000), _due("just-below", NOISY, 600, priority=99)]:
        ahead._plan(job)
    holding = ahead._look_at_backlogs(0.0)
    assert holding == {NOISY}
    assert [job.job_id for job in ahead._pop_planned(T, holding)] == ["high", "higher"]
    assert ahead.deferred == 2

    backlogs[NOISY] = 10_000
    ahead._plan(_due("urgent-but-over", NOISY, 500, priority=1000))
    assert ahead._pop_planned(T, ahead._look_at_backlogs(0.0)) == [] and ahead.deferred == 3


async def test_without_a_reserve_every_priority_is_deferred_alike():
    ahead = _deferring_write_ahead(ManualClock(T), {NOISY: 10}, limit=10)
    ahead._plan(_due("high", NOISY, 800, priority=1000))
    assert ahead._pop_planned(T, ahead._look_at_backlogs(0.0)) == [] and ahead.deferred == 1


async def test_planning_many_loaded_jobs_lets_the_loop_run_between_slices():
    # A scan of the whole window (every 30 s) may read tens of thousands of jobs: planned in one go
    # they would hold the loop for tens of milliseconds while runs are due.
    ahead = _deferring_write_ahead(ManualClock(T), {}, limit=10)
    ahead._fence = lambda shard_id: object()  # type: ignore[assignment,return-value]  # every shard owned
    jobs = [_due(f"job-{index}", NOISY, -index) for index in range(4 * PLAN_SLICE)]
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = turns
    await ahead.plan_loaded(jobs)
    other.cancel()
    assert ahead.size == len(jobs)
    assert turns - before >= 3  # the loop ran between the slices


async def test_a_scan_reading_deferred_jobs_again_leaves_them_in_line_with_the_copy_read():
    ahead = _deferring_write_ahead(ManualClock(T), {NOISY: 10}, limit=10)
    ahead._fence = lambda shard_id: object()  # type: ignore[assignment,return-value]  # every shard owned
    for name, ms in (("first", 900), ("second", 800)):
        ahead._plan(_due(name, NOISY, ms))
    assert ahead._pop_planned(T, ahead._look_at_backlogs(0.0)) == [] and ahead.deferred == 2
    newer = _due("first", NOISY, 700)  # read again by a whole-window scan, changed meanwhile
    older = _due("second", NOISY, 850)  # a copy read before the deferred one was planned: not taken
    await ahead.plan_loaded([newer, older])
    assert ahead.size == 2 and not ahead._planned  # not planned a second time
    assert list(ahead._deferred[NOISY].values()) == [newer, _due("second", NOISY, 800)]


async def test_a_deferred_job_read_again_as_urgent_leaves_the_line():
    ahead = _deferring_write_ahead(ManualClock(T), {NOISY: 10}, limit=10_000, reserve=PriorityReserve(priority=100, credits=2))
    ahead._fence = lambda shard_id: object()  # type: ignore[assignment,return-value]  # every shard owned
    ahead._look_at_backlogs(0.0)
    ahead._plan(_due("job", NOISY, 900))
    backlogs_over_floor = {NOISY: MIN_BACKLOG}
    ahead._backlogs = lambda: backlogs_over_floor
    assert ahead._pop_planned(T, ahead._look_at_backlogs(0.0)) == [] and ahead.deferred == 1
    await ahead.plan_loaded([_due("job", NOISY, 900, priority=500)])  # its priority raised elsewhere
    assert ahead.deferred == 0
    assert [job.job_id for job in ahead._pop_planned(T, ahead._look_at_backlogs(0.0))] == ["job"]


async def test_a_job_removed_and_planned_again_for_the_same_time_is_written_once_as_planned_last():
    """The removed plan stays in the heap, dead, beside the new one with the same fire time and job
    id: the two tie, and the live one is the one taken (its new priority), once."""
    ahead = _deferring_write_ahead(ManualClock(T), {}, limit=10)
    ahead._plan(_due("job", QUIET, 100, priority=0))
    ahead.job_removed("job")
    again = _due("job", QUIET, 100, priority=5)
    ahead._plan(again)
    ahead._plan(_due("other", QUIET, 100))
    assert ahead.size == 2
    taken = ahead._pop_planned(T, frozenset())
    assert sorted(job.job_id for job in taken) == ["job", "other"]
    assert [job for job in taken if job.job_id == "job"] == [again]
    assert [job for job in taken if job.job_id == "job"][0] is again
    assert ahead.size == 0 and ahead._pop_planned(T, frozenset()) == []
