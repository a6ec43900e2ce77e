"""Runs sent ahead of their instant, with a real daemon (``--send-ahead 300``) and a real worker.

The worker probes the node's clock after connecting; once its estimate is within the lead, the
node sends it each run 300 ms early with the instant to start it, and the worker holds the run
until then. The recording worker writes, per attempt, when its assignment arrived
(``assignment_received_at``) and when the handler started (``received_at``). The worker starts a
held run on its estimate of the node's clock, which is right to within the uncertainty it reports
(tens of microseconds on loopback, and either way): "on the instant" is asserted to within an upper
bound of what it reported, read from the node's histogram of those reports.

A node killed inside the lead, after the worker has the held run, loses nothing and doubles
nothing: the dispatch was journalled as for any fast send (the test waits until it is durable,
i.e. the run is ``dispatched``, before the kill), so the attempt holds a lease of its own in the
database. The worker starts the run on its instant without the node, keeps the result until a
node acknowledges it, and the restarted node neither sends the run again (it reads only
``scheduled`` runs, and the lease is live) nor refuses the result (the attempts table names this
worker): the run succeeds once, with one attempt. A kill before the dispatch is durable would be
the at-least-once case of every fast send: the restarted node would deliver the run again, as a
second attempt in its history.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from e2e_support import Daemon, Process, Recorder, instant, uncertainty_bound, wait_for, workers_connected

from fastlane.client import Client
from fastlane.domain.models import RunState, Schedule

pytestmark = pytest.mark.e2e

LEAD = timedelta(milliseconds=300)
AHEAD = ("--send-ahead", str(int(LEAD.total_seconds() * 1000)))
SHARDS = 8


@pytest.fixture
async def node(sqlite_url: str, tmp_path: Path, processes: list[Process]) -> Daemon:
    daemon = Daemon(sqlite_url, tmp_path / "daemon.log", shards=SHARDS, extra_args=AHEAD)
    daemon.start()
    processes.append(daemon)
    await daemon.wait_ready()
    return daemon


@pytest.fixture
async def client(node: Daemon) -> AsyncIterator[Client]:
    async with Client(node.address) as connected:
        yield connected


@pytest.fixture
async def worker(node: Daemon, client: Client, tmp_path: Path, processes: list[Process]) -> Recorder:
    """A recording worker whose clock estimate the node has heard (so it can be sent runs ahead)."""
    recorder = Recorder(node.address, tmp_path / "received.jsonl", tmp_path / "worker.log")
    recorder.start()
    processes.append(recorder)

    async def probed() -> bool:
        return (await workers_connected(client) == 1
                and node.metrics().get("fastlane_worker_clock_uncertainty_seconds_count", 0) > 0)

    await wait_for(probed, 20, "the worker to connect and report a clock estimate")
    return recorder



def received_and_started(worker: Recorder, job_id: str) -> list[tuple[datetime, datetime]]:
    """(assignment received, handler started) of each attempt of the job the worker started."""
    return [(instant(entry["assignment_received_at"]), instant(entry["received_at"]))
            for entry in worker.received_for(job_id)]


async def wait_run_settled(client: Client, run_id: str) -> tuple:  # type: ignore[type-arg]
    """The run and its attempts once it has succeeded (its result reached a node)."""

    async def settled() -> tuple | None:  # type: ignore[type-arg]
        run, attempts = await client.get_run(run_id)
        return (run, attempts) if run.state is RunState.SUCCEEDED else None

    return await wait_for(settled, 30, f"run {run_id} to succeed")


async def test_a_run_sent_ahead_is_received_before_its_instant_and_started_on_it(
    node: Daemon, client: Client, worker: Recorder
) -> None:
    scheduled = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    job = await client.create("ahead", "e2e", Schedule.at_instant(scheduled))

    await wait_for(lambda: worker.received_for(job.job_id), 15, "the run to start on the worker")
    early = uncertainty_bound(node)
    [(received, started)] = received_and_started(worker, job.job_id)
    assert received < scheduled <= started + early, (received, scheduled, started, early)
    assert started - scheduled < timedelta(milliseconds=100), "held, but not started on its instant"

    runs = (await client.list_runs(job_id=job.job_id)).items
    run, attempts = await wait_run_settled(client, runs[0].run_id)
    assert [attempt.attempt for attempt in attempts] == [1]
    assert scheduled - LEAD <= attempts[0].dispatched_at < scheduled  # sent the lead ahead
    assert attempts[0].started_at is not None and attempts[0].started_at + early >= scheduled
    assert node.metrics()["fastlane_runs_sent_ahead_total"] == 1


async def test_a_node_killed_inside_the_lead_leaves_the_held_run_to_start_once(
    node: Daemon, client: Client, worker: Recorder
) -> None:
    scheduled = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    job = await client.create("ahead-crash", "e2e", Schedule.at_instant(scheduled))

    async def dispatched() -> str | None:
        runs = (await client.list_runs(job_id=job.job_id)).items
        return runs[0].run_id if runs and runs[0].state is RunState.DISPATCHED else None

    run_id = await wait_for(dispatched, 10, "the run's dispatch to be durable", interval=0.01)
    early = uncertainty_bound(node)
    await asyncio.sleep(0.03)  # the assignment went out before its dispatch was written: it has arrived
    node.kill()
    killed_at = datetime.now(UTC)
    assert killed_at < scheduled, "the kill came too late to be inside the lead"

    # No node: the worker starts the held run on its instant all the same.
    await wait_for(lambda: worker.received_for(job.job_id), 10, "the held run to start without its node")
    [(received, started)] = received_and_started(worker, job.job_id)
    assert received < killed_at < scheduled <= started + early, (received, killed_at, scheduled, started, early)

    node.start()  # same address, same database file
    await node.wait_ready()

    run, attempts = await wait_run_settled(client, run_id)
    assert run.attempts == 1 and [attempt.attempt for attempt in attempts] == [1]
    assert attempts[0].started_at is not None and attempts[0].started_at + early >= scheduled
    await asyncio.sleep(2)  # a rebuild, a sweep and a lease check later: nothing is sent again
    assert len(worker.received_for(job.job_id)) == 1
    _, attempts = await client.get_run(run_id)
    assert len(attempts) == 1


async def test_a_node_killed_before_recording_a_sent_run_leaves_history_with_what_the_worker_did(
    node: Daemon, client: Client, worker: Recorder, sqlite_url: str
) -> None:
    """The kill comes after the assignment left and before its dispatch was written (the test holds
    the database's write lock meanwhile): the database still has the run waiting. The worker runs
    it on its instant and reports it to the restarted node, which records it as the worker's
    attempt, ``reported_late``. Either that report lands first and completes the run (one
    attempt), or the restarted node has sent the run again first (the worker runs it twice) and
    history shows both, the second marked as a redelivery."""
    scheduled = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    job = await client.create("ahead-unrecorded", "e2e", Schedule.at_instant(scheduled))
    run_id = await wait_for(lambda: first_run_id(client, job.job_id), 10, "the run to be materialised")
    early = uncertainty_bound(node)

    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=5, isolation_level=None) as writer_lock:
        writer_lock.execute("BEGIN IMMEDIATE")  # the node's writes wait: its dispatch is never written
        await wait_for(lambda: node.metrics().get("fastlane_runs_sent_ahead_total", 0) >= 1, 10,
                       "the run to be sent ahead", interval=0.01)
        node.kill()
        assert datetime.now(UTC) < scheduled, "the kill came too late to be inside the lead"
        writer_lock.execute("ROLLBACK")

    await wait_for(lambda: worker.received_for(job.job_id), 10, "the held run to start without its node")
    node.start()
    await node.wait_ready()

    run, attempts = await wait_run_settled(client, run_id)
    ran = received_and_started(worker, job.job_id)
    assert scheduled <= ran[0][1] + early
    late = [attempt for attempt in attempts if attempt.reported_late]
    assert len(late) == 1 and late[0].worker_id  # the worker that reported it
    assert late[0].outcome.value == "succeeded" and late[0].started_at is not None
    assert len(attempts) == len(ran), (attempts, ran)  # history has every delivery the worker ran
    if len(ran) == 1:
        assert run.attempts == 1 and not late[0].redelivery
    else:
        [again] = [attempt for attempt in attempts if not attempt.reported_late]
        assert again.redelivery and not late[0].redelivery and again.worker_id == late[0].worker_id


async def first_run_id(client: Client, job_id: str) -> str | None:
    runs = (await client.list_runs(job_id=job_id)).items
    return runs[0].run_id if runs else None
