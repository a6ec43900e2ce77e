"""Backfill and jitter with real processes, on both backends: ``jobs backfill`` runs a job's past
fire times through a real daemon and a real recording worker, one at a time and oldest first,
once, and ``runs cancel --backfill`` stops the rest; a jittered schedule's runs start on their
jittered instants, each as ``jobs preview --job-id`` says, none before its instant."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from e2e_support import ROOT, Daemon, child_environment, instant, run_cli, uncertainty_bound, wait_for
from test_run_lifecycle import handler_spans, overlapping, worker_ready

from fastlane.domain.jitter import run_instant
from fastlane.domain.models import RunState, Schedule

pytestmark = pytest.mark.e2e

HOUR = timedelta(hours=1)


def local_cli(*args: str) -> object:
    """``fastlane ARGS --json`` for a command that needs no daemon (``jobs preview``)."""
    completed = subprocess.run([sys.executable, "-m", "fastlane", *args, "--json"], capture_output=True,
                               env=child_environment(), cwd=ROOT, timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr.decode()
    return orjson.loads(completed.stdout)


async def test_a_backfill_runs_the_missed_fire_times_one_at_a_time_oldest_first_and_only_once(
        daemon: Daemon, client, recorder):
    await worker_ready(client)
    anchor = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=5, minutes=30)
    job = await client.create("hourly-export", "e2e", Schedule.interval(HOUR, anchor), payload={"sleep": 0.2})
    fire_times = [anchor + k * HOUR for k in range(6)]  # the last 30 min ago; the next is 30 min ahead

    counted = await asyncio.to_thread(run_cli, daemon, "jobs", "backfill", job.name, "--from", "6h", "--dry-run")
    assert (counted["fire_times"], counted["written"], counted["backfill_id"]) == (6, 6, None)  # type: ignore[index]
    assert (await client.list_runs(job_id=job.job_id)).items == []

    done = await asyncio.to_thread(run_cli, daemon, "jobs", "backfill", job.name, "--from", "6h", "--batch", "4")
    assert (done["fire_times"], done["written"], done["already_run"]) == (6, 6, 0)  # type: ignore[index]
    backfill_id = done["backfill_id"]  # type: ignore[index]

    async def all_succeeded() -> bool:
        runs = (await client.list_runs(backfill_id=backfill_id)).items
        return len(runs) == 6 and all(run.state is RunState.SUCCEEDED for run in runs)

    await wait_for(all_succeeded, 60, "the six backfilled runs to succeed")
    received = recorder.received_for(job.job_id)
    assert sorted(instant(entry["scheduled_for"]) for entry in received) == fire_times  # each once
    spans = handler_spans(recorder, job.job_id)
    assert overlapping(spans) == [], "buffer_all ran two of the backfill's runs at once"
    by_start = sorted(received, key=lambda entry: instant(entry["received_at"]))
    assert [instant(entry["scheduled_for"]) for entry in by_start] == fire_times  # oldest first
    listed = await asyncio.to_thread(run_cli, daemon, "runs", "list", "--backfill", backfill_id)
    assert {run["backfill_id"] for run in listed} == {backfill_id}  # type: ignore[union-attr]
    assert all(run["manual"] for run in listed)  # type: ignore[union-attr]

    # Again: nothing is missed any more. With --all each would get a second run.
    again = await asyncio.to_thread(run_cli, daemon, "jobs", "backfill", job.job_id, "--from", "6h")
    assert (again["written"], again["already_run"]) == (0, 6)  # type: ignore[index]
    every = await asyncio.to_thread(run_cli, daemon, "jobs", "backfill", job.job_id, "--from", "6h", "--all",
                                    "--overlap", "allow", "--dry-run")
    assert every["written"] == 6  # type: ignore[index]
    shown = await asyncio.to_thread(run_cli, daemon, "jobs", "get", job.job_id)
    actions = [event["action"] for event in shown["history"]]  # type: ignore[index]
    assert actions.count("backfilled") == 2  # its two parts (4, then 2); the one that wrote nothing is not one


async def test_cancelling_a_backfill_stops_the_runs_it_has_not_started(daemon: Daemon, client, recorder):
    await worker_ready(client)
    anchor = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=7, minutes=30)
    job = await client.create("slow-export", "e2e", Schedule.interval(HOUR, anchor), payload={"sleep": 30})
    done = await asyncio.to_thread(run_cli, daemon, "jobs", "backfill", job.job_id, "--from", anchor.isoformat())
    assert done["written"] == 8  # type: ignore[index]
    backfill_id = done["backfill_id"]  # type: ignore[index]
    await wait_for(lambda: len(recorder.received_for(job.job_id)) == 1, 30, "the oldest to start")
    cancelled = await asyncio.to_thread(run_cli, daemon, "runs", "cancel", "--backfill", backfill_id, "--yes")
    assert (cancelled["matched"], cancelled["acted"]) == (8, 8)  # type: ignore[index]

    async def all_cancelled() -> bool:
        runs = (await client.list_runs(backfill_id=backfill_id)).items
        return {run.state for run in runs} == {RunState.CANCELLED}

    await wait_for(all_cancelled, 30, "the backfill's runs to be cancelled (the running one stopped)")
    assert len(recorder.received_for(job.job_id)) == 1  # none after the cancel started


async def test_a_jittered_schedule_starts_each_run_on_its_own_instant_never_before_it(daemon: Daemon, client,
                                                                                       recorder):
    await worker_ready(client)
    every, jitter = timedelta(seconds=2), timedelta(milliseconds=1500)
    anchor = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    schedule = Schedule.interval(every, anchor, jitter=jitter)
    jobs = [await client.create(f"spread-{index}", "e2e", schedule) for index in range(3)]
    await wait_for(lambda: all(len(recorder.received_for(job.job_id)) >= 3 for job in jobs), 40,
                   "three runs of each jittered job")
    # The worker starts a run sent ahead on the instant by its estimate of the node's clock: by its
    # own clock it may seem early by that estimate's uncertainty, never more (as test_send_ahead).
    early = uncertainty_bound(daemon)
    offsets = set()
    for job in jobs:
        assert (await client.get_job(job.job_id)).spec.schedule.jitter == jitter
        for entry in recorder.received_for(job.job_id):
            scheduled = instant(entry["scheduled_for"])
            fire = anchor + ((scheduled - anchor) // every) * every
            assert scheduled == run_instant(job.job_id, schedule, fire)
            assert timedelta(0) <= scheduled - fire < jitter
            assert instant(entry["received_at"]) + early >= scheduled, "a jittered run started before its instant"
            offsets.add(scheduled - fire)
    assert len(offsets) > 3  # spread, not one offset for all
    # The CLI's preview, computed on its own, names the very instants the node ran.
    first = jobs[0]
    shown = await asyncio.to_thread(
        local_cli, "jobs", "preview", "--every", "2s", "--anchor", anchor.isoformat(), "--jitter", "1500ms",
        "--job-id", first.job_id, "--after", (anchor - timedelta(seconds=1)).isoformat(), "--count", "3")
    ran = sorted(instant(entry["scheduled_for"]) for entry in recorder.received_for(first.job_id))[:3]
    assert [instant(row["run_at"]) for row in shown] == ran  # type: ignore[union-attr]
