"""The worker SDK against a fake node (fastlane.testing.wire): an in-process gRPC server scripted by each test.

The fake node welcomes every Hello, records every message the worker sends, acknowledges results
when ``auto_ack`` is on, sends what a test queues, and ends a stream when the test closes it or the
worker closes its sending side. Every wait is bounded; none is a fixed sleep.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import orjson
import pytest

from fastlane._proto import common_pb2
from fastlane.domain.models import MAX_CHECKPOINT_BYTES
from fastlane.errors import ConfigurationError, PermanentError, RetryableError
from fastlane.rpc.wire import duration, timestamp
from fastlane.testing.wire import SCHEDULED_FOR, assignment, ns_stamp, start_server
from fastlane.testing.wire import FakeWorkerService as FakeNode
from fastlane.worker import RunContext, Worker, run_worker_cli

WAIT = 5.0  # upper bound for anything the worker should do promptly
REPO_ROOT = Path(__file__).resolve().parents[2]


# -- the fake node -----------------------------------------------------------------------------


@pytest.fixture
async def node() -> AsyncIterator[FakeNode]:
    """A fake node serving on a free port; its server is stopped after the test."""
    fake = FakeNode()
    server = await start_server(fake)
    try:
        yield fake
    finally:
        await asyncio.wait_for(server.stop(grace=None), WAIT)


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """``worker.run()`` as a task; stopped (bounded) on exit, and its error, if any, raised."""
    task = asyncio.create_task(worker.run(), name="test-worker-run")
    try:
        yield task
    finally:
        if not task.done():
            try:
                await asyncio.wait_for(worker.stop(), 3 * WAIT)
            except TimeoutError:
                task.cancel()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), WAIT)
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()


async def settle() -> None:
    """Let ready callbacks run (a bounded number of loop turns, not a time)."""
    for _ in range(20):
        await asyncio.sleep(0)


def blocking_worker(node: FakeNode, release: asyncio.Event, started: asyncio.Event | None = None, **options) -> Worker:
    """A worker whose "block" handler sets ``started``, then waits for ``release``."""
    worker = Worker(node.address, **({"drain_timeout": 1.0} | options))

    @worker.handler("block")
    async def block(ctx: RunContext) -> None:
        if started is not None:
            started.set()
        await release.wait()

    return worker


# -- handshake and heartbeats ------------------------------------------------------------------


async def test_hello_carries_worker_id_job_types_and_credits_and_heartbeats_follow_welcome_interval(node):
    node.heartbeat_interval = timedelta(milliseconds=50)
    release = asyncio.Event()
    worker = blocking_worker(node, release, worker_id="w-1", concurrency=7)

    @worker.handler("alpha")
    async def alpha(ctx: RunContext) -> None:
        await release.wait()

    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1", "alpha"), assignment("r2", "block"))
        # The default interval is seconds long: three beats this soon mean the Welcome's was used.
        await node.wait_until(lambda: len(stream.bodies("heartbeats")) >= 3, timeout=2.0)
        release.set()

    hello = stream.received[0].hello
    assert (hello.worker_id, sorted(hello.job_types), hello.credits, hello.tenant) == ("w-1", ["alpha", "block"], 7, "")
    for beats in stream.bodies("heartbeats")[:3]:
        assert sorted((b.run_id, b.lease_token, b.started) for b in beats.beats) == [("r1", 7, True), ("r2", 7, True)]


async def test_progress_and_checkpoint_reach_the_node_in_a_prompt_heartbeat_only_when_changed(node):
    worker = Worker(node.address, drain_timeout=1.0)  # node interval 30 s: only prompt beats come
    beaten_twice, release = asyncio.Event(), asyncio.Event()

    @worker.handler("long")
    async def long(ctx: RunContext) -> None:
        ctx.report_progress(0.5)
        ctx.save_checkpoint(b"step-2")
        await ctx.heartbeat()
        await ctx.heartbeat()  # nothing changed since: a bare beat
        beaten_twice.set()
        await release.wait()

    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1", "long", lease_token=3))
        await asyncio.wait_for(beaten_twice.wait(), WAIT)
        await node.wait_until(lambda: len(stream.bodies("heartbeats")) >= 2)
        release.set()

    first, second = (body.beats[0] for body in stream.bodies("heartbeats")[:2])
    assert (first.run_id, first.lease_token, first.started) == ("r1", 3, True)
    assert first.HasField("progress") and first.progress == 0.5
    assert first.HasField("checkpoint") and first.checkpoint == b"step-2"
    assert not second.HasField("progress") and not second.HasField("checkpoint")


async def test_progress_and_checkpoint_are_validated(node):
    worker = Worker(node.address, drain_timeout=1.0)
    errors: list[type[Exception]] = []

    @worker.handler("validate")
    async def validate(ctx: RunContext) -> None:
        for bad in (1.5, -0.1, math.nan, "half"):
            try:
                ctx.report_progress(bad)  # type: ignore[arg-type]
            except ValueError as exc:
                errors.append(type(exc))
        try:
            ctx.save_checkpoint(b"x" * (MAX_CHECKPOINT_BYTES + 1))
        except ValueError as exc:
            errors.append(type(exc))
        ctx.save_checkpoint(b"x" * MAX_CHECKPOINT_BYTES)

    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1", "validate"))
        await node.wait_until(lambda: len(stream.results()) == 1)

    assert errors == [ValueError] * 5
    assert stream.results()[0].outcome == common_pb2.ATTEMPT_OUTCOME_SUCCEEDED


# -- running attempts --------------------------------------------------------------------------


async def test_assignment_runs_handler_with_full_context_and_success_reports_lease_token_and_one_credit(node):
    worker = Worker(node.address, drain_timeout=1.0)
    seen: list[RunContext] = []

    @worker.handler("echo")
    async def echo(ctx: RunContext) -> None:
        seen.append(ctx)

    released = datetime(2030, 1, 2, 3, 4, 6, tzinfo=UTC)
    async with running(worker):
        stream = await node.stream(0)
        before = datetime.now(UTC)
        stream.assign(assignment(
            "r1", payload=orjson.dumps({"to": "ada"}), attempt=3, lease_token=42, checkpoint=b"half-way",
            released_at=timestamp(released),
        ))
        await node.wait_until(lambda: stream.credits_granted() >= 1)

    (ctx,) = seen
    assert (ctx.run_id, ctx.job_id, ctx.job_type, ctx.tenant, ctx.attempt) == ("r1", "job-r1", "echo", "acme", 3)
    assert (ctx.payload, ctx.json()) == (b'{"to":"ada"}', {"to": "ada"})
    assert (ctx.scheduled_for, ctx.released_at) == (SCHEDULED_FOR, released)
    assert (ctx.idempotency_key, ctx.lease_token, ctx.checkpoint) == ("key-r1", 42, b"half-way")
    assert before <= ctx.received_at <= datetime.now(UTC)
    (result,) = stream.results()
    assert (result.run_id, result.lease_token, result.outcome, result.error_code) == ("r1", 42, common_pb2.ATTEMPT_OUTCOME_SUCCEEDED, "")
    assert result.started_at.ToDatetime(UTC) <= result.finished_at.ToDatetime(UTC)
    kinds = stream.kinds()
    assert kinds[kinds.index("results") + 1] == "credit"  # to an older node the grant follows the results at once
    assert stream.credits_granted() == 1


async def test_a_node_that_takes_credits_with_results_gets_both_in_one_message(node):
    node.credits_with_results = True
    worker = Worker(node.address, drain_timeout=1.0)

    @worker.handler("echo")
    async def echo(ctx: RunContext) -> None:
        pass

    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1"), assignment("r2"))
        await node.wait_until(lambda: stream.credits_granted() >= 2)

    assert "credit" not in stream.kinds()
    assert sorted(result.run_id for result in stream.results()) == ["r1", "r2"]
    assert sum(body.credits for body in stream.bodies("results")) == 2


async def test_empty_payload_reads_as_json_none_and_missing_checkpoint_as_none(node):
    worker = Worker(node.address, drain_timeout=1.0)
    seen: list[RunContext] = []

    @worker.handler("echo")
    async def echo(ctx: RunContext) -> None:
        seen.append(ctx)

    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1"))
        await node.wait_until(lambda: len(stream.results()) == 1)

    assert (seen[0].json(), seen[0].checkpoint, seen[0].released_at) == (None, None, None)


@pytest.mark.parametrize(
    ("error", "outcome", "error_code", "error_message"),
    [
        (PermanentError("no such account"), common_pb2.ATTEMPT_OUTCOME_PERMANENT_FAILURE, "PermanentError", "no such account"),
        (RetryableError("smtp busy"), common_pb2.ATTEMPT_OUTCOME_FAILED, "RetryableError", "smtp busy"),
        (ValueError("bad input " + "x" * 3000), common_pb2.ATTEMPT_OUTCOME_FAILED, "ValueError", ("bad input " + "x" * 3000)[:2000]),
    ],
    ids=["permanent", "retryable", "value-error-truncated"],
)
async def test_handler_errors_map_to_outcomes(node, error, outcome, error_code, error_message):
    worker = Worker(node.address, drain_timeout=1.0)

    @worker.handler("echo")
    async def fail(ctx: RunContext) -> None:
        raise error

    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1"))
        await node.wait_until(lambda: len(stream.results()) == 1)

    (result,) = stream.results()
    assert (result.outcome, result.error_code, result.error_message) == (outcome, error_code, error_message)
    assert stream.credits_granted() == 1


async def test_handler_running_past_its_timeout_is_reported_timed_out(node):
    worker = Worker(node.address, drain_timeout=1.0)
    cancelled = asyncio.Event()

    @worker.handler("slow")
    async def slow(ctx: RunContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1", "slow", timeout=duration(timedelta(milliseconds=50))))
        await node.wait_until(lambda: len(stream.results()) == 1)

    (result,) = stream.results()
    assert (result.outcome, result.error_code) == (common_pb2.ATTEMPT_OUTCOME_TIMED_OUT, "TimeoutError")
    assert cancelled.is_set()


async def test_cancel_runs_cancels_the_running_handler_and_reports_cancelled_with_reason(node):
    worker = Worker(node.address, drain_timeout=1.0)
    started, observed = asyncio.Event(), asyncio.Event()

    @worker.handler("slow")
    async def slow(ctx: RunContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            observed.set()
            raise

    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1", "slow", lease_token=5), assignment("r2", "slow", lease_token=5))
        await asyncio.wait_for(started.wait(), WAIT)
        stream.cancel("r1", 5, "job deleted")
        await node.wait_until(lambda: len(stream.results()) == 1)
        assert observed.is_set()
        stream.cancel("r2", 4, "stale lease")  # not this attempt: r2 keeps running
        stream.cancel("r2", 5, "job paused")
        await node.wait_until(lambda: len(stream.results()) == 2)

    results = [(r.run_id, r.lease_token, r.outcome, r.error_message) for r in stream.results()]
    assert results == [("r1", 5, common_pb2.ATTEMPT_OUTCOME_CANCELLED, "job deleted"), ("r2", 5, common_pb2.ATTEMPT_OUTCOME_CANCELLED, "job paused")]
    assert stream.credits_granted() == 2


async def test_many_assignments_are_reported_in_far_fewer_results_messages(node):
    worker = Worker(node.address, concurrency=500, drain_timeout=1.0)

    @worker.handler("quick")
    async def quick(ctx: RunContext) -> None:
        await asyncio.sleep(0)

    async with running(worker):
        stream = await node.stream(0)
        for batch in range(5):
            stream.assign(*(assignment(f"r{batch}-{i}", "quick") for i in range(100)))
        await node.wait_until(lambda: len(stream.results()) == 500, timeout=3 * WAIT)

    assert {r.outcome for r in stream.results()} == {common_pb2.ATTEMPT_OUTCOME_SUCCEEDED}
    assert len({r.run_id for r in stream.results()}) == 500
    assert len(stream.bodies("results")) <= 50
    assert stream.credits_granted() == 500


# -- reconnects --------------------------------------------------------------------------------


async def test_unacked_results_are_resent_first_after_reconnect_and_acked_ones_are_not(node):
    node.auto_ack = False
    worker = Worker(node.address, concurrency=4, drain_timeout=1.0)

    @worker.handler("echo")
    async def echo(ctx: RunContext) -> None:
        pass

    async with running(worker):
        first = await node.stream(0)
        first.assign(assignment("acked"), assignment("unacked"))
        await node.wait_until(lambda: len(first.results()) == 2)
        first.ack(*(r for r in first.results() if r.run_id == "acked"))
        first.close()
        second = await node.stream(1)
        await node.wait_until(lambda: len(second.received) >= 2)
        node.auto_ack = True
        second.ack(*second.results())

    assert second.kinds()[:2] == ["hello", "results"]
    assert second.received[0].hello.credits == 4
    assert [r.run_id for r in second.received[1].results.results] == ["unacked"]
    assert [r.run_id for r in second.results()] == ["unacked"]  # "acked" is never sent again
    assert "credit" not in second.kinds()[:3]  # the Hello's credits already count that run


async def test_handler_running_across_node_restart_reports_on_the_new_stream(node):
    release, started = asyncio.Event(), asyncio.Event()
    first_server = await start_server(node)  # the fixture's server is not used by this worker
    worker = blocking_worker(node, release, started, concurrency=4)
    restarted: grpc.aio.Server | None = None
    try:
        async with running(worker):
            first = await node.stream(0)
            first.assign(assignment("r1", "block"))
            await asyncio.wait_for(started.wait(), WAIT)
            assert worker.connected
            await asyncio.wait_for(first_server.stop(grace=None), WAIT)  # the node dies: UNAVAILABLE
            restarted = await start_server(node, node.address)
            second = await node.stream(1)
            await node.wait_until(lambda: len(second.bodies("heartbeats")) >= 1)
            release.set()
            await node.wait_until(lambda: len(second.results()) == 1)
    finally:
        await asyncio.wait_for(first_server.stop(grace=None), WAIT)
        if restarted is not None:
            await asyncio.wait_for(restarted.stop(grace=None), WAIT)

    assert second.received[0].hello.credits == 3  # one run still in flight
    assert [b.run_id for b in second.bodies("heartbeats")[0].beats] == ["r1"]
    (result,) = second.results()
    assert (result.run_id, result.outcome) == ("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)
    assert second.credits_granted() == 1
    assert first.results() == []


# -- runs sent ahead, and the node's clock ------------------------------------------------------

MS = 1_000_000


def entry_recording_worker(node: FakeNode, entered: dict[str, int], release: asyncio.Event | None = None,
                           contexts: list[RunContext] | None = None, **options) -> Worker:
    """A worker whose "held" handler notes when it was entered (worker clock, ns), then waits for
    ``release`` if given."""
    worker = Worker(node.address, **({"drain_timeout": 2.0} | options))

    @worker.handler("held")
    async def held(ctx: RunContext) -> None:
        entered[ctx.run_id] = time.time_ns()
        if contexts is not None:
            contexts.append(ctx)
        if release is not None:
            await release.wait()

    return worker


async def test_probes_follow_the_welcome_and_an_echo_gives_the_clock_estimate(node):
    node.clock_ahead_ns = 250 * MS
    node.heartbeat_interval = timedelta(milliseconds=100)  # probes keep coming at this pace after the first five
    worker = entry_recording_worker(node, {})
    async with running(worker):
        stream = await node.stream(0)
        await node.wait_until(lambda: len(stream.bodies("clock_probe")) >= 5)
        await node.wait_until(lambda: node.address in worker.clock_estimates())
        offset, uncertainty = worker.clock_estimates()[node.address]
        # The node read its clock during the round trip, so the estimate is right within its bound.
        assert abs(offset - 0.25) <= uncertainty + 1e-6
        assert 0 <= uncertainty < 1.0
        await node.wait_until(lambda: any(p.HasField("uncertainty") for p in stream.bodies("clock_probe")))

    probes = stream.bodies("clock_probe")
    assert stream.kinds().index("clock_probe") > stream.kinds().index("hello")
    assert len({p.probe_id for p in probes}) == len(probes)
    assert not probes[0].HasField("uncertainty") and not probes[0].HasField("offset")  # nothing known yet
    informed = next(p for p in probes if p.HasField("uncertainty"))
    assert abs(informed.offset.ToNanoseconds() - 250 * MS) <= informed.uncertainty.ToNanoseconds() + 1_000


async def test_a_node_that_never_echoes_leaves_no_estimate_and_runs_still_start_on_receipt(node):
    entered: dict[str, int] = {}
    worker = entry_recording_worker(node, entered)
    async with running(worker):
        stream = await node.stream(0)
        await node.wait_until(lambda: len(stream.bodies("clock_probe")) >= 5)
        stream.assign(assignment("r1", "held"))
        await node.wait_until(lambda: len(stream.results()) == 1)
        assert worker.clock_estimates() == {}

    assert [(r.run_id, r.outcome) for r in stream.results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]


async def test_a_run_sent_ahead_starts_on_its_instant_not_on_receipt(node):
    node.heartbeat_interval = timedelta(milliseconds=50)
    entered: dict[str, int] = {}
    contexts: list[RunContext] = []
    release = asyncio.Event()
    worker = entry_recording_worker(node, entered, release, contexts, concurrency=4)
    async with running(worker):
        stream = await node.stream(0)
        start_at = time.time_ns() + 500 * MS  # no clock echo: the node's clock is taken as the worker's
        stream.assign(assignment("r1", "held", start_at=ns_stamp(start_at)))
        # Held: in flight, heartbeaten as not started, no credit given back, no handler yet.
        await node.wait_until(lambda: any(not beat.started for beat in stream.beats_of("r1")))
        assert "r1" not in entered
        await node.wait_until(lambda: "r1" in entered)
        await node.wait_until(lambda: any(beat.started for beat in stream.beats_of("r1")))
        assert stream.results() == [] and stream.credits_granted() == 0
        release.set()
        await node.wait_until(lambda: len(stream.results()) == 1)

    assert entered["r1"] >= start_at  # never before the instant
    assert entered["r1"] - start_at < 50 * MS  # and soon after it (generous: the machine is noisy)
    (ctx,) = contexts
    assert ctx.received_at < ctx.started_at
    assert ctx.started_at >= datetime.fromtimestamp(start_at / 1e9, UTC) - timedelta(microseconds=1)
    (result,) = stream.results()
    assert result.outcome == common_pb2.ATTEMPT_OUTCOME_SUCCEEDED
    assert result.started_at.ToDatetime(UTC) == ctx.started_at  # the real start
    started_flags = [beat.started for beat in stream.beats_of("r1")]
    assert started_flags == sorted(started_flags)  # not started, then started: never back


async def test_a_run_sent_ahead_starts_on_its_instant_translated_to_the_worker_clock(node):
    node.clock_ahead_ns = 400 * MS
    entered: dict[str, int] = {}
    worker = entry_recording_worker(node, entered)
    async with running(worker):
        stream = await node.stream(0)
        await node.wait_until(lambda: node.address in worker.clock_estimates())
        await node.wait_until(lambda: len(stream.bodies("clock_probe")) >= 5)
        await asyncio.sleep(0.1)  # the last quick probes' echoes: the estimate only gets better after this
        uncertainty_ns = round(worker.clock_estimates()[node.address].uncertainty_s * 1e9) + 1_000
        start_at_node = time.time_ns() + 400 * MS + 200 * MS  # 200 ms ahead, on the node's clock
        stream.assign(assignment("r1", "held", start_at=ns_stamp(start_at_node)))
        await node.wait_until(lambda: len(stream.results()) == 1)

    on_worker_clock = start_at_node - 400 * MS
    assert entered["r1"] >= on_worker_clock - uncertainty_ns  # the estimate is right within its uncertainty
    assert entered["r1"] - on_worker_clock < uncertainty_ns + 50 * MS


async def test_a_withdrawal_drops_a_held_run_and_leaves_a_started_one_running(node):
    entered: dict[str, int] = {}
    release = asyncio.Event()
    worker = entry_recording_worker(node, entered, release, concurrency=4)
    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("running", "held"),
                      assignment("ahead", "held", start_at=ns_stamp(time.time_ns() + 5_000 * MS)))
        await node.wait_until(lambda: "running" in entered)
        stream.withdraw([("running", 7), ("ahead", 7)], "sent elsewhere")
        await node.wait_until(lambda: len(stream.results()) == 1)
        (withdrawn,) = stream.results()
        assert (withdrawn.run_id, withdrawn.outcome, withdrawn.error_message) == ("ahead", common_pb2.ATTEMPT_OUTCOME_CANCELLED, "sent elsewhere")
        await node.wait_until(lambda: stream.credits_granted() == 1)  # the withdrawn run's credit comes back
        release.set()
        await node.wait_until(lambda: len(stream.results()) == 2)

    assert [(r.run_id, r.outcome) for r in stream.results()] == [("ahead", common_pb2.ATTEMPT_OUTCOME_CANCELLED), ("running", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]
    assert set(entered) == {"running"}  # the held handler was never entered


async def test_a_cancelled_held_run_never_enters_its_handler(node):
    entered: dict[str, int] = {}
    worker = entry_recording_worker(node, entered)
    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1", "held", lease_token=3, start_at=ns_stamp(time.time_ns() + 300 * MS)))
        await settle()
        stream.cancel("r1", 3, "job deleted")
        await node.wait_until(lambda: len(stream.results()) == 1)
        await node.wait_until(lambda: stream.credits_granted() == 1)
        await asyncio.sleep(0.4)  # past the instant it would have started on

    (result,) = stream.results()
    assert (result.run_id, result.outcome, result.error_message) == ("r1", common_pb2.ATTEMPT_OUTCOME_CANCELLED, "job deleted")
    assert entered == {}
    assert stream.credits_granted() == 1


async def test_a_held_run_survives_a_reconnect_and_starts_on_its_instant(node):
    entered: dict[str, int] = {}
    worker = entry_recording_worker(node, entered, concurrency=4)
    async with running(worker):
        first = await node.stream(0)
        start_at = time.time_ns() + 1_000 * MS
        first.assign(assignment("r1", "held", start_at=ns_stamp(start_at)))
        await settle()
        first.close()  # the stream ends while the run is held
        second = await node.stream(1)
        await node.wait_until(lambda: len(second.beats_of("r1")) >= 1)  # heartbeaten on the new stream
        await node.wait_until(lambda: len(second.results()) == 1)

    assert second.received[0].hello.credits == 3  # held: in flight, on a credit
    assert not second.beats_of("r1")[0].started
    assert entered["r1"] >= start_at
    assert [(r.run_id, r.outcome) for r in second.results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]


async def test_stop_lets_a_held_run_start_on_its_instant_and_finish(node):
    node.heartbeat_interval = timedelta(milliseconds=50)
    entered: dict[str, int] = {}
    worker = entry_recording_worker(node, entered)
    async with running(worker):
        stream = await node.stream(0)
        start_at = time.time_ns() + 300 * MS
        stream.assign(assignment("r1", "held", start_at=ns_stamp(start_at)))
        await node.wait_until(lambda: len(stream.beats_of("r1")) >= 1)  # the worker holds it
        await asyncio.wait_for(worker.stop(), WAIT)

    assert entered["r1"] >= start_at
    assert [(r.run_id, r.outcome) for r in stream.results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]


async def test_a_run_still_held_at_the_drain_timeout_is_reported_retryable_and_never_started(node):
    node.heartbeat_interval = timedelta(milliseconds=50)
    entered: dict[str, int] = {}
    worker = entry_recording_worker(node, entered, drain_timeout=0.1)
    async with running(worker):
        stream = await node.stream(0)
        stream.assign(assignment("r1", "held", start_at=ns_stamp(time.time_ns() + 5_000 * MS)))
        await node.wait_until(lambda: len(stream.beats_of("r1")) >= 1)
        await asyncio.wait_for(worker.stop(), WAIT)

    (result,) = stream.results()
    assert (result.outcome, result.error_code) == (common_pb2.ATTEMPT_OUTCOME_FAILED, "WorkerShutdown")
    assert entered == {}


# -- stopping ----------------------------------------------------------------------------------


@pytest.mark.parametrize("credits_with_results", [False, True], ids=["older-node", "credits-in-results"])
async def test_stop_lets_the_running_handler_finish_and_report_before_run_returns(node, credits_with_results):
    node.credits_with_results = credits_with_results
    release, started = asyncio.Event(), asyncio.Event()
    worker = blocking_worker(node, release, drain_timeout=10.0)
    order: list[str] = []

    @worker.handler("ordered")
    async def ordered(ctx: RunContext) -> None:
        started.set()
        await release.wait()
        order.append("handler finished")

    async with running(worker) as run_task:
        run_task.add_done_callback(lambda _: order.append("run returned"))
        stream = await node.stream(0)
        stream.assign(assignment("r1", "ordered"))
        await asyncio.wait_for(started.wait(), WAIT)
        stopping = asyncio.create_task(worker.stop(), name="test-stop")
        await settle()
        assert not run_task.done()
        release.set()
        await asyncio.wait_for(stopping, WAIT)

    assert order == ["handler finished", "run returned"]
    assert [(r.run_id, r.outcome) for r in stream.results()] == [("r1", common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]
    assert stream.worker_closed
    assert stream.credits_granted() == 0  # a stopping worker asks for no more work


async def test_drain_timeout_cancels_stuck_handler_and_reports_it_retryable(node):
    worker = Worker(node.address, drain_timeout=0.1)
    started, observed = asyncio.Event(), asyncio.Event()

    @worker.handler("stuck")
    async def stuck(ctx: RunContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            observed.set()
            raise

    async with running(worker) as run_task:
        stream = await node.stream(0)
        stream.assign(assignment("r1", "stuck"))
        await asyncio.wait_for(started.wait(), WAIT)
        await asyncio.wait_for(worker.stop(), WAIT)
        assert run_task.done()

    assert observed.is_set()
    (result,) = stream.results()
    assert (result.outcome, result.error_code) == (common_pb2.ATTEMPT_OUTCOME_FAILED, "WorkerShutdown")
    assert stream.worker_closed


async def test_stop_before_run_makes_run_return_at_once_and_stop_is_idempotent(node):
    worker = Worker(node.address)

    @worker.handler("echo")
    async def echo(ctx: RunContext) -> None:
        pass

    await worker.stop()
    await worker.stop()
    await asyncio.wait_for(worker.run(), WAIT)
    assert node.streams == [] and not worker.connected


# -- registration ------------------------------------------------------------------------------


def test_handler_rejects_sync_functions_and_duplicate_job_types():
    worker = Worker()

    with pytest.raises(TypeError, match="async"):

        @worker.handler("sync")
        def sync(ctx: RunContext) -> None:
            pass

    @worker.handler("once")
    async def once(ctx: RunContext) -> None:
        pass

    with pytest.raises(ConfigurationError, match="already has a handler"):

        @worker.handler("once")
        async def twice(ctx: RunContext) -> None:
            pass

    assert worker.job_types == ("once",)


# -- command line ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "complaint"),
    [
        ("no_such_module_here:worker", "cannot import"),
        ("fastlane.domain.models:MAX_CHECKPOINT_BYTES", "not a fastlane Worker"),
        ("fastlane.domain.models", "must look like"),
    ],
)
def test_cli_reports_unusable_targets_with_exit_code_2(capsys, target, complaint):
    assert run_worker_cli(target, [], None) == 2
    assert complaint in capsys.readouterr().err


CLI_TARGET = textwrap.dedent("""
    import asyncio
    import logging

    from fastlane.worker import Worker

    logging.basicConfig(level=logging.INFO)

    def make_worker():
        worker = Worker("127.0.0.1:1", worker_id="cli-worker", drain_timeout=60)

        @worker.handler("noop")
        async def noop(ctx):
            pass

        @worker.handler("forever")
        async def forever(ctx):
            logging.getLogger("cli_target").info("forever started")
            await asyncio.Event().wait()

        return worker
""")


async def start_cli_worker(node: FakeNode, tmp_path: Path) -> asyncio.subprocess.Process:
    """``run_worker_cli`` in a child process, on a factory target beside it, pointed at ``node``."""
    (tmp_path / "cli_target.py").write_text(CLI_TARGET)
    program = (
        "import sys; from fastlane.worker import run_worker_cli; "
        f"sys.exit(run_worker_cli('cli_target:make_worker', [{node.address!r}], 3))"
    )
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", program, cwd=tmp_path, env=env, stderr=asyncio.subprocess.PIPE
    )


async def stderr_line_containing(process: asyncio.subprocess.Process, text: str) -> str:
    assert process.stderr is not None
    async with asyncio.timeout(3 * WAIT):
        while line := (await process.stderr.readline()).decode():
            if text in line:
                return line
    raise AssertionError(f"the worker exited without logging {text!r}")


async def stop_process(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
    await asyncio.wait_for(process.communicate(), WAIT)


async def test_cli_runs_worker_until_sigterm_then_drains_and_exits_0(node, tmp_path):
    process = await start_cli_worker(node, tmp_path)
    try:
        stream = await asyncio.wait_for(node.stream(0), 3 * WAIT)
        hello = stream.received[0].hello
        assert (hello.worker_id, sorted(hello.job_types), hello.credits) == ("cli-worker", ["forever", "noop"], 3)
        stream.assign(assignment("r1", "noop"))
        await node.wait_until(lambda: len(stream.results()) == 1)
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 3 * WAIT)
        assert process.returncode == 0
        await node.wait_until(lambda: stream.worker_closed)
    finally:
        await stop_process(process)


async def test_cli_second_signal_exits_at_once_with_1_while_a_handler_still_runs(node, tmp_path):
    process = await start_cli_worker(node, tmp_path)
    try:
        stream = await asyncio.wait_for(node.stream(0), 3 * WAIT)
        stream.assign(assignment("r1", "forever"))
        await stderr_line_containing(process, "forever started")
        process.send_signal(signal.SIGTERM)
        await stderr_line_containing(process, "stopping gracefully")
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), WAIT)  # far within the 60 s drain timeout
        assert process.returncode == 1
        assert stream.results() == []
    finally:
        await stop_process(process)
