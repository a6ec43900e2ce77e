"""Bulk actions with real processes: ``runs retry`` and ``runs cancel``, ``jobs pause``,
``jobs resume`` and ``jobs delete`` over a selection, through the CLI a user types, against a
real daemon and a real recording worker, on both backends."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from e2e_support import ROOT, Daemon, child_environment, instant, run_cli, wait_for
from test_run_lifecycle import QUICK_RETRY, worker_ready

from fastlane.domain.limits import MAX_SEND_AHEAD
from fastlane.domain.models import JobState, RunState, Schedule
from fastlane.engine.write_ahead import MAX_ADAPTIVE_LEAD
from fastlane.errors import RemoteNotFound

pytestmark = pytest.mark.e2e

UNSERVED = "nobody.serves"  # a job type no worker declares: its runs wait for ever
# How far ahead of its instant a node writes (and sends) a run, at most.
WRITTEN_AHEAD = MAX_ADAPTIVE_LEAD + MAX_SEND_AHEAD


def cli_refusal(daemon: Daemon, *args: str) -> tuple[int, str, str]:
    """Run ``fastlane ARGS`` expecting it to refuse: its exit code, stdout and stderr."""
    completed = subprocess.run([sys.executable, "-m", "fastlane", *args, "--server", daemon.address],
                               capture_output=True, env=child_environment(), cwd=ROOT, timeout=60, check=False)
    return completed.returncode, completed.stdout.decode(), completed.stderr.decode()


async def runs_of(client, job_type: str) -> list:  # type: ignore[no-untyped-def, type-arg]
    return (await client.list_runs(job_type=job_type, page_size=1000)).items


async def test_every_dead_run_of_a_type_is_replayed_and_every_waiting_run_of_an_unserved_type_cancelled(
        daemon: Daemon, client, recorder):
    await worker_ready(client)
    doomed = [await client.create(f"doomed-{index}", "e2e", Schedule.now(), payload={"fail": "permanent"},
                                  retry=QUICK_RETRY) for index in range(4)]
    waiting = [await client.create(f"unserved-{index}", UNSERVED, Schedule.now()) for index in range(6)]

    async def all_dead() -> bool:
        runs = await runs_of(client, "e2e")
        return len(runs) == 4 and all(run.state is RunState.DEAD for run in runs)

    await wait_for(all_dead, 30, "the four permanent failures to be dead")
    await wait_for(lambda: _count(runs_of(client, UNSERVED), 6), 20, "the six unserved runs to be written")

    # Counted first: without --yes nothing changes, and the exit code says so.
    code, out, err = await asyncio.to_thread(cli_refusal, daemon, "runs", "retry", "--type", "e2e")
    assert (code, out.strip()) == (1, "4 runs would be scheduled again"), err
    assert "add --yes" in err
    assert {run.attempts for run in await runs_of(client, "e2e")} == {1}

    replayed = await asyncio.to_thread(run_cli, daemon, "runs", "retry", "--type", "e2e", "--yes")
    assert replayed == {"action": "retry", "dry_run": False, "matched": 4, "acted": 4, "skipped": 0,
                        "stopped_because": None}
    # Each dead run went to the worker again: attempt 2, same run and idempotency key.
    await wait_for(lambda: len(recorder.received()) >= 8, 30, "every replayed attempt to reach the worker")
    attempts = sorted((entry["job_id"], entry["attempt"]) for entry in recorder.received())
    assert attempts == sorted((job.job_id, attempt) for job in doomed for attempt in (1, 2))
    await wait_for(all_dead, 30, "the replayed runs to fail again")

    counted = await asyncio.to_thread(run_cli, daemon, "runs", "cancel", "--type", UNSERVED, "--dry-run")
    assert counted == {"action": "cancel", "dry_run": True, "matched": 6}
    first = await asyncio.to_thread(run_cli, daemon, "runs", "cancel", "--type", UNSERVED, "--yes", "--limit", "4")
    assert (first["matched"], first["acted"]) == (4, 4)  # type: ignore[index]
    rest = await asyncio.to_thread(run_cli, daemon, "runs", "cancel", "--type", UNSERVED, "--state", "scheduled",
                                   "--yes")
    assert (rest["matched"], rest["acted"]) == (2, 2)  # type: ignore[index]
    assert {run.state for run in await runs_of(client, UNSERVED)} == {RunState.CANCELLED}
    assert {run.job_id for run in await runs_of(client, UNSERVED)} == {job.job_id for job in waiting}
    # Nothing of the other type was touched, and there is nothing left to cancel.
    assert {run.state for run in await runs_of(client, "e2e")} == {RunState.DEAD}
    again = await asyncio.to_thread(run_cli, daemon, "runs", "cancel", "--type", UNSERVED, "--yes")
    assert (again["matched"], again["acted"]) == (0, 0)  # type: ignore[index]
    # Each cancel is in the run's own history, as a one-run cancel is.
    shown = await asyncio.to_thread(run_cli, daemon, "runs", "get", (await runs_of(client, UNSERVED))[0].run_id)
    assert [event["action"] for event in shown["history"]] == ["cancelled"]  # type: ignore[index]


async def _count(runs, expected: int) -> bool:  # type: ignore[no-untyped-def]
    return len(await runs) == expected



async def test_every_job_of_a_type_is_paused_stops_firing_is_resumed_fires_again_and_is_deleted(
        daemon: Daemon, client, recorder):
    await worker_ready(client)
    ticking = [await client.create(f"tick-{index}", "e2e", Schedule.interval(timedelta(seconds=1)))
               for index in range(3)]
    bystander = await client.create("bystander", UNSERVED, Schedule.interval(timedelta(hours=1)))

    def received_since(since: datetime) -> dict[str, int]:
        ids = {job.job_id for job in ticking}
        counts = dict.fromkeys(ids, 0)
        for entry in recorder.received():
            if entry["job_id"] in ids and instant(entry["received_at"]) > since:
                counts[entry["job_id"]] += 1
        return counts

    started = datetime.now(UTC)
    await wait_for(lambda: min(received_since(started).values()) >= 1, 30, "each ticking job to fire")

    code, out, err = await asyncio.to_thread(cli_refusal, daemon, "jobs", "pause", "--type", "e2e")
    assert (code, out.strip()) == (1, "3 jobs would be paused"), err
    paused = await asyncio.to_thread(run_cli, daemon, "jobs", "pause", "--type", "e2e", "--yes")
    assert paused == {"action": "pause", "dry_run": False, "matched": 3, "acted": 3, "skipped": 0,
                      "stopped_because": None}
    paused_at = datetime.now(UTC)
    assert {(await client.get_job(job.job_id)).state for job in ticking} == {JobState.PAUSED}
    # A pause stops a job making runs; one already written ahead of its instant (a lead, at most
    # WRITTEN_AHEAD) still starts. A job of the same type made now fires past that bound: the node
    # and the worker are live, and no paused job fired a run of its own after it.
    bound = paused_at + WRITTEN_AHEAD
    witness = await client.create("witness", "e2e", Schedule.interval(timedelta(seconds=1)))
    await wait_for(lambda: any(instant(entry["scheduled_for"]) > bound + timedelta(seconds=1)
                               for entry in recorder.received_for(witness.job_id)), 30, "the witness to fire")
    late = [entry for job in ticking for entry in recorder.received_for(job.job_id)
            if instant(entry["scheduled_for"]) > bound]
    assert late == [], "a paused job fired"
    counted = await asyncio.to_thread(run_cli, daemon, "jobs", "resume", "--state", "paused", "--dry-run")
    assert counted == {"action": "resume", "dry_run": True, "matched": 3}

    resumed_at = datetime.now(UTC)
    resumed = await asyncio.to_thread(run_cli, daemon, "jobs", "resume", "--type", "e2e", "--yes")
    assert (resumed["matched"], resumed["acted"]) == (3, 3)  # type: ignore[index]
    await wait_for(lambda: min(received_since(resumed_at).values()) >= 1, 30, "each resumed job to fire again")

    deleted = await asyncio.to_thread(run_cli, daemon, "jobs", "delete", "--type", "e2e", "--yes")
    assert (deleted["matched"], deleted["acted"]) == (4, 4)  # type: ignore[index]
    for job in [*ticking, witness]:
        with pytest.raises(RemoteNotFound):
            await client.get_job(job.job_id)
    assert (await client.get_job(bystander.job_id)).state is JobState.ACTIVE
