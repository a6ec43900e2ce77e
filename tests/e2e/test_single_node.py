"""One real daemon process, one real worker process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from e2e_support import Daemon, Recorder, instant, wait_for

from fastlane.domain.models import AttemptOutcome, RunState, Schedule

pytestmark = pytest.mark.e2e

# Runs are written this far ahead of their time (the daemon's default lead) and may still fire
# after a pause or delete that lands in between.
LEAD = timedelta(milliseconds=300)

CLOCK_READING_TOLERANCE = timedelta(milliseconds=1)


async def worker_connected(client) -> bool:  # type: ignore[no-untyped-def]
    status = await client.cluster()
    return any(node.workers_connected > 0 for node in status.nodes)


async def test_every_schedule_kind_fires_and_reaches_the_worker(client, recorder: Recorder):
    await wait_for(lambda: worker_connected(client), 20, "the worker to connect")
    soon = datetime.now(UTC) + timedelta(seconds=1.5)
    now_job = await client.create("now", "e2e", Schedule.now())
    at_job = await client.create("at", "e2e", Schedule.at_instant(soon))
    every_job = await client.create("every", "e2e", Schedule.interval(timedelta(seconds=1)))
    cron_job = await client.create("cron", "e2e", Schedule.cron_expr("* * * * * *", "Europe/Paris"))

    def enough() -> bool:
        return (len(recorder.received_for(now_job.job_id)) >= 1 and len(recorder.received_for(at_job.job_id)) >= 1
                and len(recorder.received_for(every_job.job_id)) >= 2 and len(recorder.received_for(cron_job.job_id)) >= 2)

    await wait_for(enough, 20, "runs of every schedule kind")
    [at_run] = recorder.received_for(at_job.job_id)
    assert instant(at_run["scheduled_for"]) == soon
    # Read on the worker's own wall clock: a run sent ahead starts on the instant by the worker's
    # estimate of the node's clock, which may differ from its own by tens of microseconds.
    assert instant(at_run["received_at"]) >= soon - CLOCK_READING_TOLERANCE
    cron_times = [instant(entry["scheduled_for"]) for entry in recorder.received_for(cron_job.job_id)]
    assert all(t.microsecond == 0 for t in cron_times)  # a 6-field expression fires on whole seconds
    every_times = sorted(instant(entry["scheduled_for"]) for entry in recorder.received_for(every_job.job_id))
    assert every_times[1] - every_times[0] == timedelta(seconds=1)

    # History: each run with its attempt, worker and timestamps, once the result is durable.
    async def succeeded():  # type: ignore[no-untyped-def]
        page = await client.list_runs(job_id=at_job.job_id)
        return page.items if page.items and page.items[0].state is RunState.SUCCEEDED else None

    [run] = await wait_for(succeeded, 10, "the at run to be recorded as succeeded")
    run, attempts = await client.get_run(run.run_id)
    assert run.attempts == 1 and run.worker_id and run.finished_at is not None
    [attempt] = attempts
    assert attempt.outcome is AttemptOutcome.SUCCEEDED and attempt.worker_id == run.worker_id
    assert attempt.dispatched_at <= attempt.finished_at and attempt.node_id == "node-1"


async def test_pause_stops_firing_and_resume_restarts_it(client, recorder: Recorder):
    await wait_for(lambda: worker_connected(client), 20, "the worker to connect")
    job = await client.create("paused", "e2e", Schedule.interval(timedelta(milliseconds=200)))
    await wait_for(lambda: len(recorder.received_for(job.job_id)) >= 2, 10, "the first runs")
    await client.pause_job(job.job_id)
    paused_at = datetime.now(UTC)
    await asyncio.sleep(1.5)  # a quiet period is what is being tested: nothing may fire in it
    resumed_at = datetime.now(UTC)
    fired_while_paused = [
        entry for entry in recorder.received_for(job.job_id)
        if paused_at + LEAD < instant(entry["scheduled_for"]) < resumed_at
    ]
    assert fired_while_paused == []
    await client.resume_job(job.job_id)
    await wait_for(
        lambda: any(instant(e["received_at"]) > resumed_at for e in recorder.received_for(job.job_id)),
        10, "runs after resume",
    )


async def test_delete_stops_the_job(client, recorder: Recorder):
    await wait_for(lambda: worker_connected(client), 20, "the worker to connect")
    job = await client.create("deleted", "e2e", Schedule.interval(timedelta(milliseconds=200)))
    await wait_for(lambda: len(recorder.received_for(job.job_id)) >= 1, 10, "the first run")
    await client.delete_job(job.job_id)
    deleted_at = datetime.now(UTC)
    await asyncio.sleep(1.2)  # nothing may fire in this window
    late = [e for e in recorder.received_for(job.job_id) if instant(e["scheduled_for"]) > deleted_at + LEAD]
    assert late == []


async def test_trigger_runs_a_job_at_once(client, recorder: Recorder):
    await wait_for(lambda: worker_connected(client), 20, "the worker to connect")
    job = await client.create("yearly", "e2e", Schedule.cron_expr("0 0 1 1 *", "UTC"))
    run = await client.trigger_job(job.job_id)
    assert run.manual
    [entry] = await wait_for(lambda: recorder.received_for(job.job_id), 10, "the triggered run")
    assert entry["run_id"] == run.run_id and entry["idempotency_key"] == run.run_id


async def test_daemon_killed_and_restarted_loses_and_doubles_nothing(db_url, tmp_path, processes):
    daemon = Daemon(db_url, tmp_path / "daemon.log")
    daemon.start()
    processes.append(daemon)
    await daemon.wait_ready()
    worker = Recorder(daemon.address, tmp_path / "received.jsonl", tmp_path / "worker.log")
    worker.start()
    processes.append(worker)
    from fastlane.client import Client

    start = datetime.now(UTC)
    async with Client(daemon.address) as client:
        await wait_for(lambda: worker_connected(client), 20, "the worker to connect")
        every = await client.create("every", "e2e", Schedule.interval(timedelta(milliseconds=250)))
        one_shots = [
            await client.create(f"at-{i}", "e2e", Schedule.at_instant(start + timedelta(seconds=1 + 0.5 * i)))
            for i in range(10)
        ]
        await wait_for(lambda: len(worker.received_for(every.job_id)) >= 4, 10, "runs before the crash")
    daemon.kill()
    killed_at = datetime.now(UTC)
    await asyncio.sleep(2.0)  # downtime: occurrences pass while no node runs
    daemon.argv = daemon.argv  # same port, same database
    daemon.start()
    await daemon.wait_ready()
    async with Client(daemon.address) as client:
        await wait_for(
            lambda: all(worker.received_for(job.job_id) for job in one_shots), 20, "every one-shot to fire"
        )
        await wait_for(
            lambda: any(instant(e["scheduled_for"]) > killed_at + timedelta(seconds=3)
                        for e in worker.received_for(every.job_id)),
            20, "the interval job to catch up",
        )
        # Every occurrence has exactly one run: no gap, no duplicate (downtime < misfire grace).
        runs = await collect_runs(client, every.job_id)
        times = sorted(run.scheduled_for for run in runs if not run.manual)
        assert len(times) == len(set(times)), "an occurrence has two runs"
        steps = {b - a for a, b in zip(times, times[1:], strict=False)}
        assert steps == {timedelta(milliseconds=250)}, f"gaps in the occurrences: {sorted(steps)}"
        for job in one_shots:
            assert len(await collect_runs(client, job.job_id)) == 1
        deliveries = Counter(e["run_id"] for e in worker.received())
        # At-least-once: a run in flight at the crash may be delivered again, but never as a new run.
        assert set(deliveries) <= {run.run_id for job in [every, *one_shots] for run in await collect_runs(client, job.job_id)}


async def collect_runs(client, job_id: str):  # type: ignore[no-untyped-def]
    runs, token = [], ""
    while True:
        page = await client.list_runs(job_id=job_id, page_size=1000, page_token=token)
        runs.extend(page.items)
        token = page.next_page_token
        if not token:
            return runs
