"""A worker stopping on SIGTERM, with real processes: it finishes what it runs, and the node sends
it nothing more, though it had granted credits before the signal (its Drain takes them back)."""

from __future__ import annotations

import signal
import time

import pytest
from e2e_support import Daemon, Process, Recorder, start_recorder, wait_for, workers_connected

from fastlane.domain.models import AttemptOutcome, Delivery, RunState, Schedule

pytestmark = pytest.mark.e2e


async def test_a_worker_stopping_on_sigterm_is_sent_no_new_run(
    daemon: Daemon, client, recorder: Recorder, tmp_path, processes: list[Process]
):
    await wait_for(lambda: workers_connected(client), 20, "the worker to connect")
    running = await client.create("long", "e2e", Schedule.now(), payload={"sleep": 6})
    [entry] = await wait_for(lambda: recorder.received_for(running.job_id)[:1], 20, "the long run")
    assert recorder.popen is not None
    recorder.popen.send_signal(signal.SIGTERM)  # 199 of its 200 credits are still the node's to use
    daemon_log = tmp_path / "daemon.log"
    await wait_for(lambda: "is stopping" in daemon_log.read_text(), 20, "the node to hear the worker stop")

    # An at-most-once run due now: sent to the stopping worker, the drain timeout could cut it
    # before it ends, and it would never run again.
    late = await client.create("late", "e2e", Schedule.now(), delivery=Delivery.AT_MOST_ONCE)
    second = start_recorder(daemon.address, tmp_path, processes, "second")
    [taken] = await wait_for(lambda: second.received_for(late.job_id)[:1], 20, "the late run on the second worker")
    assert recorder.received_for(late.job_id) == []

    started = time.monotonic()
    assert recorder.popen.wait(20) == 0, recorder.log_tail()
    assert time.monotonic() - started < 20
    run, attempts = await client.get_run(entry["run_id"])
    assert run.state is RunState.SUCCEEDED and [a.outcome for a in attempts] == [AttemptOutcome.SUCCEEDED]
    late_run = await wait_for(lambda: _finished(client, taken["run_id"]), 20, "the late run to finish")
    assert late_run.state is RunState.SUCCEEDED and late_run.attempts == 1


async def _finished(client, run_id: str):  # type: ignore[no-untyped-def]
    run, _ = await client.get_run(run_id)
    return run if run.finished_at is not None else None
