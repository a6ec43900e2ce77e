"""Misbehaving workers on the WorkerService stream of a real daemon, on each backend.

Seeded sessions send anything before the hello, hellos with bad ids, thousands of job types and
any credits, heartbeats and results for unknown runs or with wrong lease tokens, progress NaN, -1
or 2, checkpoints over 1 MiB, clock probes with any ids, send times, uncertainties and offsets (at
and past their bounds), second hellos and empty messages, then half-close or drop the
stream abruptly. Each stream must end OK (after the worker half-closes) or with a documented
status; meanwhile a well-behaved worker (the recording worker process) must still receive every
run of its own jobs, and afterwards no session may be left connected and the node must pass the
same survival checks as the API fuzzing (health, canary, restart on the same database).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fuzz_harness import ALLOWED_STREAM_CODES, CALL_TIMEOUT, CHANNEL_OPTIONS, FuzzNode, Tally, describe, report
from google.protobuf.duration_pb2 import Duration
from hypothesis import HealthCheck, Phase, given, settings
from strategies import WORKER_JOB_TYPE, Memory, Session, sessions

from fastlane._proto import common_pb2, jobs_pb2, workers_pb2, workers_pb2_grpc

pytestmark = [pytest.mark.fuzz, pytest.mark.e2e, pytest.mark.timeout(420)]

SESSIONS = 300
# Every this many sessions, a job for the well-behaved worker is created.
GOOD_JOB_EVERY = 20
# After the worker half-closes, the node must end the stream within this many seconds.
HALF_CLOSE_WAIT = 5.0

FUZZ_SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=SESSIONS,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def play(channel: grpc.Channel, session: Session, memory: Memory) -> dict[str, Any]:
    """Run one session on a new stream; how it ended and what was sent.

    The stream uses the synchronous gRPC client. grpc.aio's client, when a write fails because
    the node has already ended the stream, replaces the node's status with its own INTERNAL
    ("Internal error from Core"), so the node's real answer (say INVALID_ARGUMENT for a message
    before the hello) would be lost. The synchronous client stops pulling requests instead and
    reports the status the node sent.
    """
    stub = workers_pb2_grpc.WorkerServiceStub(channel)
    outbox: queue.Queue[workers_pb2.ConnectRequest | None] = queue.Queue()
    sent: list[workers_pb2.ConnectRequest] = []
    assigned: list[workers_pb2.Assignment] = []

    def requests() -> Iterator[workers_pb2.ConnectRequest]:
        while (message := outbox.get()) is not None:  # None: half-close
            sent.append(message)
            yield message

    responses = stub.Connect(requests(), timeout=CALL_TIMEOUT)

    def read() -> None:
        with contextlib.suppress(grpc.RpcError):
            for message in responses:
                if message.WhichOneof("body") == "assignments":
                    assigned.extend(message.assignments.assignments)
                    for assignment in message.assignments.assignments:
                        memory.runs = [*memory.runs[-499:], (assignment.tenant, assignment.run_id)]

    reader = threading.Thread(target=read, name="fuzz-stream-reader", daemon=True)
    reader.start()
    cancelled_by_test = hung = False
    try:
        for step in session.steps:
            if step.pause:
                time.sleep(step.pause)
            if not reader.is_alive():
                break  # the node ended the stream
            outbox.put(step.build(memory, list(assigned)))
        if session.ending == "half_close":
            outbox.put(None)
            reader.join(HALF_CLOSE_WAIT)
            hung = reader.is_alive()
        elif session.ending == "cancel_after_linger":
            time.sleep(0.05)
    finally:
        if reader.is_alive():
            cancelled_by_test = responses.cancel()
        outbox.put(None)
        reader.join(CALL_TIMEOUT)
    return {"code": responses.code(), "details": responses.details() or "", "sent": sent,
            "cancelled_by_test": cancelled_by_test, "hung": hung, "assigned": len(assigned)}


def session_request(session: Session, sent: list[workers_pb2.ConnectRequest]) -> dict[str, Any]:
    return {"ending": session.ending, "messages": [describe(message) for message in sent[:6]],
            "steps": list(session.kinds)}


def test_misbehaving_worker_streams_end_with_a_documented_status(fuzz_node: FuzzNode, tmp_path: Path) -> None:
    tally = Tally(fuzz_node.backend, "worker_stream", ALLOWED_STREAM_CODES)
    memory = Memory()
    good_jobs: list[str] = []
    messages_sent = 0
    sessions_played = 0
    runs_assigned = 0

    # Runs the misbehaving workers can really be assigned (and report on, with good or bad tokens).
    for index in range(3):
        spec = common_pb2.JobSpec(tenant="fuzz-w", name=f"fuzz-w-{index}", job_type=WORKER_JOB_TYPE, payload=b"{}")
        spec.schedule.interval.every.CopyFrom(Duration(seconds=1))
        spec.lease_ttl.CopyFrom(Duration(seconds=3))
        fuzz_node.unary("JobService", "CreateJob", jobs_pb2.CreateJobRequest(spec=spec))

    assert fuzz_node.daemon is not None
    channel = grpc.insecure_channel(fuzz_node.daemon.address, options=CHANNEL_OPTIONS)

    @FUZZ_SETTINGS
    @given(session=sessions())
    def connect(session: Session) -> None:
        nonlocal messages_sent, sessions_played, runs_assigned
        if not fuzz_node.alive():
            return
        sessions_played += 1
        if sessions_played % GOOD_JOB_EVERY == 1:
            good_jobs.append(fuzz_node.create_live_job(
                f"good-{sessions_played}", schedule=common_pb2.Schedule(now=common_pb2.Now()), lease_ttl_seconds=3))
        outcome = play(channel, session, memory)
        messages_sent += len(outcome["sent"])
        runs_assigned += outcome["assigned"]
        request = {**session_request(session, outcome["sent"]), "fuzzed": list(session.fields)}
        # The node ends a stream at its first bad message: answers are grouped by that field.
        fields = session.fields[:1] or ("(valid session)",)
        if outcome["hung"]:
            tally.record("WorkerService/Connect", fields, request, "NO_END_AFTER_HALF_CLOSE",
                         f"the stream was still open {HALF_CLOSE_WAIT} s after the worker half-closed it")
        elif outcome["cancelled_by_test"]:
            tally.record("WorkerService/Connect", fields, request, "CANCELLED_BY_TEST", "", expected=True)
        else:
            tally.record("WorkerService/Connect", fields, request, outcome["code"], outcome["details"],
                         check_named=False)

    try:
        connect()
    finally:
        channel.close()
    tally.finish()
    tally.notes.update(sessions=sessions_played, messages_sent=messages_sent,
                       runs_assigned_to_fuzzed_streams=runs_assigned, good_jobs=len(good_jobs))
    failures = []
    try:
        if tally.problems:
            failures.append(f"streams ended outside the documented set:\n{tally.failures()}")
        assert fuzz_node.alive(), f"the daemon died during the fuzzing:\n{fuzz_node.log_tail()}"
        recorder = fuzz_node.recorder
        assert recorder is not None
        started = time.monotonic()
        try:
            fuzz_node.wait_for(lambda: set(good_jobs) <= recorder.job_ids(), 30.0,
                               "every job of the well-behaved worker to reach it")
        finally:
            missing = sorted(set(good_jobs) - recorder.job_ids())
            tally.notes["good_jobs_missing"] = missing
            tally.notes["good_jobs_wait_seconds"] = round(time.monotonic() - started, 1)
        # Every misbehaving stream has ended: only the recording worker is still connected.
        fuzz_node.wait_for(lambda: fuzz_node.workers_connected() == 1, 10.0,
                           "the sessions of the ended streams to be released (workers_connected == 1)")
        fuzz_node.check_survived(tally)
    except AssertionError as error:
        failures.append(str(error))
    finally:
        report(tally, tmp_path, fuzz_node)
    assert not failures, "\n\n".join(failures)
