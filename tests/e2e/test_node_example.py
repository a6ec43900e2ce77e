"""The Node.js example (examples/node) against a real daemon, on SQLite and on PostgreSQL.

The example's worker and client load the checked-in .proto files at run time and check every
field they use against them, so this test is also the proof that a second language can speak the
API as it is: a renamed message or field makes the worker or client exit with ProtocolMismatch,
and this test fails. It needs the example's npm packages (``make node-deps``); without them it
fails, saying so, rather than skipping out of sight.

The node sends runs 300 ms ahead (``--send-ahead 300``, as in test_send_ahead.py), so a run at an
instant reaches the worker early and is held until its instant by the worker's estimate of the
node's clock.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e_support import (
    ROOT,
    Daemon,
    Process,
    child_environment,
    instant,
    read_records,
    uncertainty_bound,
    wait_for,
    workers_connected,
)

from fastlane.client import Client
from fastlane.domain.models import AttemptOutcome, RunState, ScheduleKind

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "examples" / "node"
AHEAD = ("--send-ahead", "300")
LEASE = timedelta(seconds=3)  # the shortest lease a node accepts; the node asks for a heartbeat every second
NS = 1_000_000_000


def node_binary() -> str:
    """The ``node`` to run the example with; fails the test (not skips it) when it cannot run."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the Node example (examples/node) needs Node.js 18 or later")
    for package in ("@grpc/grpc-js", "@grpc/proto-loader"):
        if not (EXAMPLE / "node_modules" / package / "package.json").is_file():
            pytest.fail(f"examples/node/node_modules has no {package}: run `make node-deps` "
                        "(npm ci in examples/node) before these tests")
    return node


class NodeWorker(Process):
    """``node examples/node/worker.js``, writing its events and node.lag's records beside its log."""

    def __init__(self, node: str, address: str, tmp_path: Path, name: str = "node-worker") -> None:
        self.events_path = tmp_path / f"{name}.events.jsonl"
        self.lag_path = tmp_path / f"{name}.lag.jsonl"
        super().__init__(
            [node, str(EXAMPLE / "worker.js"), "--server", address, "--worker-id", name, "--concurrency", "8",
             "--events", str(self.events_path), "--lag-file", str(self.lag_path), "--drain-timeout", "2"],
            tmp_path / f"{name}.log", child_environment(),
        )

    def events(self, event: str | None = None, **fields: object) -> list[dict[str, Any]]:
        return [entry for entry in read_records(self.events_path)
                if (event is None or entry["event"] == event) and all(entry.get(k) == v for k, v in fields.items())]

    def lag_records(self, job_id: str) -> list[dict[str, Any]]:
        return [entry for entry in read_records(self.lag_path) if entry["job_id"] == job_id]

    def alive(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            pytest.fail(f"the Node worker exited with {self.popen.returncode}:\n{self.log_tail()}")
        return True




async def node_client(node: str, address: str, *args: str) -> Any:
    """Run ``node examples/node/client.js ARGS`` as a user would; its JSON answer."""
    completed = await asyncio.to_thread(
        subprocess.run, [node, str(EXAMPLE / "client.js"), "--server", address, *args],
        capture_output=True, cwd=ROOT, timeout=30, check=False,
    )
    assert completed.returncode == 0, f"client.js {' '.join(args)} exited {completed.returncode}:\n" \
                                      f"{completed.stderr.decode()}"
    return json.loads(completed.stdout)


async def start_node_and_worker(db_url: str, tmp_path: Path, processes: list[Process]) -> tuple[Daemon, NodeWorker]:
    """A daemon, and a Node worker connected to it whose clock estimate the daemon has heard."""
    node = node_binary()  # first: without the packages, fail before starting anything
    daemon = Daemon(db_url, tmp_path / "daemon.log", extra_args=AHEAD)
    daemon.start()
    processes.append(daemon)
    await daemon.wait_ready()
    worker = NodeWorker(node, daemon.address, tmp_path)
    worker.start()
    processes.append(worker)
    async with Client(daemon.address) as client:
        async def probed() -> bool:
            return (worker.alive() and await workers_connected(client) == 1
                    and daemon.metrics().get("fastlane_worker_clock_uncertainty_seconds_count", 0) > 0)

        await wait_for(probed, 20, "the Node worker to connect and report a clock estimate")
    return daemon, worker



async def run_of(client: Client, job_id: str, states: set[RunState], timeout: float = 20) -> Any:
    """The job's first run once it is in one of ``states``, with its attempts."""
    async def reached() -> Any:
        runs = (await client.list_runs(job_id=job_id)).items
        if not runs:
            return None
        run, attempts = await client.get_run(sorted(runs, key=lambda r: r.scheduled_for)[0].run_id)
        return (run, attempts) if run.state in states else None

    return await wait_for(reached, timeout, f"a run of job {job_id} to be {sorted(states)}")


async def test_the_node_client_and_worker_run_every_kind_of_job(db_url: str, tmp_path: Path,
                                                                processes: list[Process]) -> None:
    daemon, worker = await start_node_and_worker(db_url, tmp_path, processes)
    node, address = node_binary(), daemon.address
    cluster = await node_client(node, address, "cluster")
    [seen] = [entry for entry in cluster["workers"] if entry["worker_id"] == "node-worker"]
    assert seen["job_types"] == ["node.checkpoint", "node.echo", "node.flaky", "node.lag", "node.slow"]

    created = await node_client(node, address, "create-all", "--prefix", "kinds", "--at-in", "3",
                                "--cron", "*/2 * * * * *", "--timezone", "America/New_York", "--every", "2")
    jobs = {entry["kind"]: entry for entry in created["jobs"]}
    assert sorted(jobs) == ["at", "cron", "interval", "now"]
    flaky = await node_client(node, address, "create", "--name", "flaky", "--type", "node.flaky", "--now",
                              "--max-attempts", "3", "--backoff", "0.2")
    resumable = await node_client(node, address, "create", "--name", "resumable", "--type", "node.checkpoint", "--now",
                                  "--payload", '{"steps": 3, "interrupt_after": 2}', "--max-attempts", "3",
                                  "--backoff", "0.2")
    slow = await node_client(node, address, "create", "--name", "slow", "--type", "node.slow", "--now",
                             "--lease-ttl", str(int(LEASE.total_seconds())))
    assert flaky["created"] and resumable["created"] and slow["created"]

    async with Client(address) as client:
        # Each kind of schedule was stored as the Node client said, and ran on the Node worker.
        kinds = {kind: (await client.get_job(entry["job_id"])).spec.schedule for kind, entry in jobs.items()}
        assert {kind: schedule.kind for kind, schedule in kinds.items()} == {
            "now": ScheduleKind.NOW, "at": ScheduleKind.AT, "cron": ScheduleKind.CRON, "interval": ScheduleKind.INTERVAL}
        assert (kinds["cron"].cron, kinds["cron"].timezone) == ("*/2 * * * * *", "America/New_York")
        assert kinds["interval"].every == timedelta(seconds=2)
        for kind, entry in jobs.items():
            run, attempts = await run_of(client, entry["job_id"], {RunState.SUCCEEDED})
            assert attempts[-1].outcome is AttemptOutcome.SUCCEEDED, (kind, attempts)
            assert worker.events("started", run_id=run.run_id), f"the {kind} run did not start on the Node worker"
        for kind in ("cron", "interval"):  # no more firing for the rest of the test
            await node_client(node, address, "delete-job", jobs[kind]["job_id"])

        # The run at an instant was sent ahead, held, and entered on its instant: never before it
        # by the worker's estimate of the node's clock (the one it translated start_at with, as the
        # protocol has it start by), and by the shared wall clock early by at most the uncertainty
        # the worker reported.
        at_job = jobs["at"]["job_id"]
        scheduled = instant(jobs["at"]["spec"]["schedule"]["at"])
        [record] = worker.lag_records(at_job)
        scheduled_ns = int(record["scheduled_ns"])
        assert scheduled_ns == int(scheduled.timestamp()) * NS + scheduled.microsecond * 1000
        assert record["start_at_ns"] == record["scheduled_ns"], "the node did not send the run ahead"
        assert int(record["received_ns"]) < scheduled_ns, "the run was not received ahead of its instant"
        assert int(record["entered_node_ns"]) >= scheduled_ns, record
        early_ns = uncertainty_bound(daemon) / timedelta(microseconds=1) * 1000
        assert int(record["entered_ns"]) + early_ns >= scheduled_ns, (record, early_ns)
        assert int(record["entered_ns"]) - scheduled_ns < 100_000_000, "held, but not started on its instant"
        [started] = worker.events("started", job_id=at_job)
        assert started["held"] is True
        run, attempts = await run_of(client, at_job, {RunState.SUCCEEDED})
        assert attempts[0].dispatched_at < scheduled
        assert daemon.metrics()["fastlane_runs_sent_ahead_total"] >= 1

        # The flaky run failed its first attempt, and the node retried it: the second succeeded.
        run, attempts = await run_of(client, flaky["job"]["job_id"], {RunState.SUCCEEDED, RunState.DEAD})
        assert [a.outcome for a in attempts] == [AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED], run.last_error
        assert attempts[0].error_code == "FlakyError" and attempts[0].error_message == "the first attempt fails on purpose"
        shown = await node_client(node, address, "get-run", run.run_id)
        assert [a["outcome"] for a in shown["attempts"]] == ["ATTEMPT_OUTCOME_FAILED", "ATTEMPT_OUTCOME_SUCCEEDED"]
        assert shown["run"]["state"] == "RUN_STATE_SUCCEEDED" and shown["run"]["attempts"] == 2

        # The checkpoint saved before the first attempt stopped reached the node and came back
        # with the second attempt, which resumed after it.
        run, attempts = await run_of(client, resumable["job"]["job_id"], {RunState.SUCCEEDED, RunState.DEAD})
        assert [a.outcome for a in attempts] == [AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED], run.last_error
        assert attempts[0].error_code == "Interrupted"
        assert run.checkpoint == b'{"step":3}' and run.progress == pytest.approx(1.0)
        shown = await node_client(node, address, "get-run", run.run_id)
        assert base64.b64decode(shown["checkpoint"]) == b'{"step":3}'
        starts = {entry["attempt"]: entry for entry in worker.events("started", run_id=run.run_id)}
        assert starts[1]["checkpoint"] is None and starts[2]["checkpoint"] == '{"step":2}'
        [ended] = worker.events("ended", run_id=run.run_id, attempt=2)
        assert json.loads(ended["output"]) == {"resumed_from": 2, "steps": 3}

        # The slow run outlives its lease on heartbeats alone, then honours a cancel.
        slow_job = slow["job"]["job_id"]
        [begun] = await wait_for(lambda: worker.events("started", job_id=slow_job), 20, "the slow run to start")
        run_id = begun["run_id"]

        async def outlived_its_lease() -> bool:
            run, attempts = await client.get_run(run_id)
            assert run.state is RunState.RUNNING and len(attempts) == 1, (run.state, attempts)
            assert attempts[0].outcome is AttemptOutcome.PENDING
            return time.time_ns() - int(begun["started_ns"]) > (LEASE * 1.5) / timedelta(microseconds=1) * 1000

        await wait_for(outlived_its_lease, 20, "the slow run to run past its lease", interval=0.2)
        listed = await node_client(node, address, "runs", "--job", slow_job, "--state", "running")
        assert [entry["run_id"] for entry in listed["runs"]] == [run_id]
        assert listed["runs"][0]["progress"] > 0  # its heartbeats carry its progress
        cancelled = await node_client(node, address, "cancel", run_id)
        assert cancelled.get("cancel_requested") or cancelled["state"] == "RUN_STATE_CANCELLED", cancelled
        [ended] = await wait_for(lambda: worker.events("ended", run_id=run_id), 10, "the handler to honour the cancel")
        assert ended["outcome"] == "ATTEMPT_OUTCOME_CANCELLED"
        run, attempts = await run_of(client, slow_job, {RunState.CANCELLED}, timeout=10)
        assert [a.outcome for a in attempts] == [AttemptOutcome.CANCELLED]
        assert worker.alive()


async def test_the_node_worker_keeps_a_result_until_a_node_acknowledges_it(db_url: str, tmp_path: Path,
                                                                          processes: list[Process]) -> None:
    """The node dies while a handler runs: the worker finishes the run, keeps its result,
    reconnects with backoff and sends the result to the restarted node, which records it."""
    daemon, worker = await start_node_and_worker(db_url, tmp_path, processes)
    node = node_binary()
    created = await node_client(node, daemon.address, "create", "--name", "sleepy", "--type", "node.echo", "--now",
                                "--payload", '{"sleep_ms": 2000}')
    job_id = created["job"]["job_id"]
    async with Client(daemon.address) as client:
        run, _ = await run_of(client, job_id, {RunState.DISPATCHED, RunState.RUNNING})  # its dispatch is durable
    assert worker.events("started", run_id=run.run_id), "the handler had not started"
    daemon.kill()

    await wait_for(lambda: worker.events("ended", run_id=run.run_id), 10, "the handler to end without its node")
    assert worker.events("disconnected")
    daemon.start()
    await daemon.wait_ready()
    async with Client(daemon.address) as client:
        done, attempts = await run_of(client, job_id, {RunState.SUCCEEDED, RunState.DEAD}, timeout=30)
    assert done.state is RunState.SUCCEEDED and [a.outcome for a in attempts] == [AttemptOutcome.SUCCEEDED]
    assert any(run.run_id in entry["run_ids"] for entry in worker.events("resent"))
    assert len(worker.events("connected")) >= 2 and worker.alive()


async def test_the_node_worker_stopping_on_sigterm_takes_its_credits_back(db_url: str, tmp_path: Path,
                                                                             processes: list[Process]) -> None:
    """SIGTERM with a handler running: the Node worker says Drain, so the node sends it nothing
    more, finishes the run, and exits 0."""
    daemon, worker = await start_node_and_worker(db_url, tmp_path, processes)
    node = node_binary()
    created = await node_client(node, daemon.address, "create", "--name", "sleepy", "--type", "node.echo", "--now",
                                "--payload", '{"sleep_ms": 1500}')
    job_id = created["job"]["job_id"]
    [started] = await wait_for(lambda: worker.events("started", job_id=job_id), 20, "the handler to start")
    assert worker.popen is not None
    worker.popen.send_signal(signal.SIGTERM)
    daemon_log = tmp_path / "daemon.log"
    await wait_for(lambda: "worker node-worker is stopping" in daemon_log.read_text(), 10, "the node to hear the Drain")
    assert worker.popen.wait(20) == 0, worker.log_tail()
    assert worker.events("ended", run_id=started["run_id"])
    async with Client(daemon.address) as client:
        done, attempts = await run_of(client, job_id, {RunState.SUCCEEDED, RunState.DEAD})
    assert [a.outcome for a in attempts] == [AttemptOutcome.SUCCEEDED]


@pytest.mark.parametrize(("edit", "script", "refusal"), [
    (("workers.proto", "google.protobuf.Timestamp start_at = 14;", "google.protobuf.Timestamp start_time = 14;"),
     "worker.js", "fastlane.v1.Assignment has no field start_at"),
    (("workers.proto", "int64 lease_token = 2;   // the attempt's lease token (Assignment.lease_token)",
      "int64 lease = 2;"), "worker.js", "fastlane.v1.RunResult has no field lease_token"),
    (("runs.proto", "GetRunResponse", "GetRunReply"), "client.js", "there is no fastlane.v1.GetRunResponse"),
], ids=["renamed-field-read", "renamed-field-sent", "renamed-message"])
async def test_the_node_example_refuses_an_api_it_does_not_speak(tmp_path: Path, edit: tuple[str, str, str],
                                                                 script: str, refusal: str) -> None:
    """What the test above relies on: with a field or message renamed in the .proto files, the
    example exits at once naming it, instead of sending messages the node reads as empty."""
    node = node_binary()
    protos = tmp_path / "proto"
    shutil.copytree(ROOT / "proto", protos)
    name, old, new = edit
    path = protos / "fastlane" / "v1" / name
    text = path.read_text()
    assert old in text, f"{name} no longer has {old!r}: update this test"
    path.write_text(text.replace(old, new))
    command = [node, str(EXAMPLE / script), "--server", "127.0.0.1:9", *(["cluster"] if script == "client.js" else [])]
    completed = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, cwd=ROOT, timeout=30, check=False,
        env=child_environment(FASTLANE_PROTO_DIR=str(protos)),
    )
    assert completed.returncode == 3, (completed.returncode, completed.stderr.decode())
    assert refusal in completed.stderr.decode()
