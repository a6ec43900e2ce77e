"""Waking held runs on their start instant: never before it, promptly after, one wait for many.

Real clocks and a real loop: the machine is noisy, so the only strict bound is "not before the
instant"; how late is bounded generously.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import common_pb2 as common_pb
from fastlane._proto import workers_pb2 as pb
from fastlane.domain.limits import MAX_CHECKPOINT_BYTES
from fastlane.domain.models import AttemptOutcome
from fastlane.server.grpc_server import max_message_bytes
from fastlane.worker import _runs as runs_module
from fastlane.worker._hold import StartTimer
from fastlane.worker._runs import (
    LATE_NS,
    MAX_HOLD_NS,
    YIELD_NS,
    RunBook,
    RunSlot,
    Verdict,
    heartbeat_messages,
    held_until,
    result_messages,
    run_attempt,
    yield_to_held,
)

MS = 1_000_000
LATE_BOUND_NS = 50 * MS  # generous: a loaded machine may wake a task late, never early


async def woken_at(timer: StartTimer, instant_ns: int) -> int:
    await timer.wait_until(instant_ns)
    return time.time_ns()


async def test_a_wait_ends_on_its_instant_never_before() -> None:
    timer = StartTimer()
    for lead_ms in (30, 5, 1, 0.05):
        instant = time.time_ns() + int(lead_ms * MS)
        woke = await woken_at(timer, instant)
        assert woke >= instant
        assert woke - instant < LATE_BOUND_NS
    await timer.close()


async def test_an_instant_already_passed_returns_at_once_without_setting_the_alarm() -> None:
    timer = StartTimer()
    await timer.wait_until(time.time_ns() - MS)
    assert timer.alarm_set_for is None


async def test_many_waits_on_one_instant_share_one_waker_and_end_together() -> None:
    timer = StartTimer()
    instant = time.time_ns() + 40 * MS
    waits = [asyncio.create_task(woken_at(timer, instant)) for _ in range(200)]
    await asyncio.sleep(0)
    assert timer.alarm_set_for == instant
    assert timer.waiting == 200
    woke = await asyncio.gather(*waits)
    assert min(woke) >= instant
    assert max(woke) - instant < LATE_BOUND_NS
    await timer.close()


async def test_an_earlier_instant_added_later_is_not_held_up_by_a_later_one() -> None:
    timer = StartTimer()
    late = asyncio.create_task(woken_at(timer, time.time_ns() + 2_000 * MS))
    await asyncio.sleep(0.01)  # the alarm is now set for the late instant
    instant = time.time_ns() + 20 * MS
    woke = await woken_at(timer, instant)
    assert timer.alarm_set_for is not None and timer.alarm_set_for > instant  # set for the late one again
    assert instant <= woke < instant + LATE_BOUND_NS
    assert not late.done()
    late.cancel()
    await asyncio.gather(late, return_exceptions=True)
    await timer.close()


async def test_a_cancelled_wait_ends_alone_and_the_waker_stops_when_nothing_waits() -> None:
    timer = StartTimer()
    instant = time.time_ns() + 30 * MS
    cancelled = asyncio.create_task(woken_at(timer, instant - 10 * MS))
    kept = asyncio.create_task(woken_at(timer, instant))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert timer.alarm_set_for == instant  # the cancelled, earlier instant gave its alarm up
    assert await kept >= instant
    assert timer.waiting == 0
    assert timer.alarm_set_for is None  # nothing is left to wake


async def test_close_cancels_pending_waits() -> None:
    timer = StartTimer()
    waiting = asyncio.create_task(woken_at(timer, time.time_ns() + 5_000 * MS))
    await asyncio.sleep(0)
    await timer.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert timer.alarm_set_for is None


# -- held attempts in the run book ---------------------------------------------------------------


class Reporter:
    """Stands for a node stream: keeps what attempts report through it."""

    def __init__(self, book: RunBook) -> None:
        self.book = book
        self.results: list[pb.RunResult] = []

    def finish(self, slot: RunSlot, result: pb.RunResult) -> None:
        if slot.key in self.book.in_flight:  # as the book does: a second report of an attempt is a no-op
            self.results.append(result)
        self.book.finish(slot, result)

    def mark_changed(self, slot: RunSlot) -> None:
        self.book.mark_changed(slot.key)

    async def beat_now(self, slot: RunSlot) -> None:
        pass


def held_assignment(run_id: str, start_at_ns: int) -> pb.Assignment:
    start_at = Timestamp()
    start_at.FromNanoseconds(start_at_ns)
    return pb.Assignment(run_id=run_id, job_type="t", lease_token=1, start_at=start_at)


async def test_a_held_attempt_handed_to_another_stream_starts_on_its_instant_and_reports_there() -> None:
    timer = StartTimer()
    entered: list[int] = []

    async def handler() -> None:
        entered.append(time.time_ns())

    async def launch(slot: RunSlot, assignment: pb.Assignment, received_at: datetime) -> None:
        await run_attempt(slot, assignment, handler, timer)

    leaving, staying = RunBook(), RunBook()
    old, new = Reporter(leaving), Reporter(staying)
    node_ahead = 300 * MS  # the node's clock is ahead: its instant is earlier on the worker's clock
    instant = time.time_ns() + 100 * MS
    leaving.start(old, [held_assignment("r1", instant + node_ahead)], datetime.now(UTC), launch, node_ahead)
    await asyncio.sleep(0)
    (slot,) = leaving.in_flight.values()
    assert slot.held and not slot.beat().started
    slots, results = leaving.take_all()  # as NodeStream.hand_over does
    for moved in slots:
        moved.stream = new
    staying.adopt(slots, results)
    async with asyncio.timeout(5):
        while not new.results:
            await asyncio.sleep(0.01)

    assert old.results == []
    (result,) = new.results
    assert result.outcome == common_pb.ATTEMPT_OUTCOME_SUCCEEDED
    assert entered[0] >= instant
    assert result.started_at.ToNanoseconds() >= instant - 1_000  # microseconds on the wire
    assert not slot.held and slot.beat().started
    await timer.close()


async def test_withdrawing_stops_only_held_attempts_and_they_never_start() -> None:
    timer = StartTimer()
    entered: list[str] = []
    release = asyncio.Event()

    async def launch(slot: RunSlot, assignment: pb.Assignment, received_at: datetime) -> None:
        async def handler() -> None:
            entered.append(assignment.run_id)
            await release.wait()

        await run_attempt(slot, assignment, handler, timer)

    book = RunBook()
    reporter = Reporter(book)
    book.start(reporter, [pb.Assignment(run_id="now", job_type="t", lease_token=1),
                          held_assignment("ahead", time.time_ns() + 5_000 * MS)], datetime.now(UTC), launch)
    await asyncio.sleep(0)
    refs = [pb.ResultAck(run_id=run_id, lease_token=1) for run_id in ("now", "ahead")]
    book.cancel(refs, Verdict(AttemptOutcome.CANCELLED, "", "withdrawn"), unstarted_only=True)
    async with asyncio.timeout(5):
        while not reporter.results:
            await asyncio.sleep(0.01)
    assert [(r.run_id, r.outcome, r.error_message) for r in reporter.results] == [("ahead", common_pb.ATTEMPT_OUTCOME_CANCELLED, "withdrawn")]
    assert list(book.in_flight) == [("now", 1)]
    release.set()
    async with asyncio.timeout(5):
        while len(reporter.results) < 2:
            await asyncio.sleep(0.01)
    assert entered == ["now"]
    assert timer.waiting == 0
    await timer.close()


def test_a_start_at_too_far_ahead_is_held_all_the_same_and_logged(caplog) -> None:  # type: ignore[no-untyped-def]
    now = 1_000 * 10**9
    assert held_until(now + 900_000_000, now) == now + 900_000_000  # a send-ahead lead: held
    assert held_until(now - 5, now) == now - 5  # already due: the timer returns at once
    assert held_until(now + MAX_HOLD_NS, now) == now + MAX_HOLD_NS
    assert "holding it" not in caplog.text
    assert held_until(now + MAX_HOLD_NS + 1, now) == now + MAX_HOLD_NS + 1  # odd, but never started early
    assert held_until(now + 10**18, now) == now + 10**18
    assert "holding it until then" in caplog.text


def test_a_late_run_yields_only_to_a_held_run_due_within_the_yield() -> None:
    now = 1_000 * 10**9
    late = now - LATE_NS
    assert yield_to_held(late, now + YIELD_NS, now) == now + YIELD_NS
    assert yield_to_held(late - 10**9, now + MS, now) == now + MS
    assert yield_to_held(late, now + YIELD_NS + 1, now) is None  # too far: start now
    assert yield_to_held(late + 1, now + MS, now) is None  # not late: starts on time, waits for nobody
    assert yield_to_held(late, None, now) is None  # nothing held


async def test_a_late_run_starts_just_after_a_held_run_due_in_a_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The yield widened so a loaded machine cannot make the test start the late run after the instant.
    monkeypatch.setattr(runs_module, "YIELD_NS", 2_000 * MS)
    timer = StartTimer()
    entered: list[tuple[str, int]] = []

    async def launch(slot: RunSlot, assignment: pb.Assignment, received_at: datetime) -> None:
        async def handler() -> None:
            entered.append((assignment.run_id, time.time_ns()))

        await run_attempt(slot, assignment, handler, timer)

    book = RunBook()
    reporter = Reporter(book)
    instant = time.time_ns() + 100 * MS
    scheduled = Timestamp()
    scheduled.FromNanoseconds(time.time_ns() - 5_000 * MS)  # out of a backlog: 5 s late
    on_time = Timestamp()
    on_time.FromNanoseconds(time.time_ns())
    book.start(reporter, [held_assignment("held", instant),
                          pb.Assignment(run_id="late", job_type="t", lease_token=1, scheduled_for=scheduled),
                          pb.Assignment(run_id="on-time", job_type="t", lease_token=1, scheduled_for=on_time),
                          # A retry's own time (after its backoff) is not on the wire: never taken as late.
                          pb.Assignment(run_id="retry", job_type="t", lease_token=1, scheduled_for=scheduled, attempt=2)],
               datetime.now(UTC), launch)
    async with asyncio.timeout(5):
        while len(reporter.results) < 4:
            await asyncio.sleep(0.01)
    order = [run_id for run_id, _ in entered]
    # The runs on time (and the retry) start at once; the late one just after the held one.
    assert order == ["on-time", "retry", "held", "late"]
    assert dict(entered)["late"] >= instant
    await timer.close()


async def test_a_wait_behind_an_overdue_alarm_is_woken_after_the_waits_queued_before_it() -> None:
    timer = StartTimer()
    instant = time.time_ns() + 5 * MS
    woken: list[str] = []

    async def wait(name: str, behind: bool) -> None:
        await timer.wait_until(instant, behind=behind)
        woken.append(name)

    first = asyncio.create_task(wait("first", False))
    await asyncio.sleep(0)
    assert timer.alarm_set_for == instant
    while time.time_ns() <= instant + MS:  # the loop is kept busy past the instant: the alarm cannot ring
        pass
    behind = asyncio.create_task(wait("behind", True))
    at_once = asyncio.create_task(wait("at once", False))
    async with asyncio.timeout(5):
        await asyncio.gather(first, behind, at_once)
    assert woken.index("first") < woken.index("behind")
    assert woken.index("at once") < woken.index("first")  # without behind: the instant has passed, no wait
    await timer.close()


def test_batches_of_reports_fit_the_smallest_message_any_node_receives() -> None:
    # Two checkpoints of 600 KiB and a hundred results with long tracebacks: each message the
    # worker sends must fit under what a node with the smallest payload limit receives, or the
    # node ends the stream (RESOURCE_EXHAUSTED) and the resend after the reconnect fails alike.
    limit = max_message_bytes(1)
    beats = [pb.RunHeartbeat(run_id=f"r{i}", lease_token=1, checkpoint=b"c" * (600 << 10)) for i in range(2)]
    results = [pb.RunResult(run_id=f"r{i}", lease_token=1, outcome=common_pb.ATTEMPT_OUTCOME_FAILED,
                            error_message="e" * 2000, error_traceback="t" * 16_000, output=b"o" * 16_000) for i in range(100)]
    largest = pb.RunHeartbeat(run_id="r", lease_token=1, checkpoint=b"c" * MAX_CHECKPOINT_BYTES)
    for messages, items in ((list(heartbeat_messages(beats + [largest])), 3), (list(result_messages(results)), 100)):
        assert all(message.ByteSize() <= limit for message in messages)
        assert sum(len(m.heartbeats.beats) + len(m.results.results) for m in messages) == items
        assert len(messages) > 1
