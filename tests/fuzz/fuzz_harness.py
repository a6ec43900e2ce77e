"""The fuzz suite's harness: a real daemon and recording worker, a client that counts every
answer by status code, and the checks that the node survived (health, a canary run on a real
worker, a restart on the same database).

The fuzz tests are synchronous hypothesis tests; their gRPC client (grpc.aio on the generated
stubs, so every field is under the test's control) runs on an event loop in a thread of its own,
which keeps it apart from pytest-asyncio's loop (used only by the ``pg_dsn`` fixture). Kept out of
conftest.py so test modules can import it by a name no other test directory uses.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
import orjson
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastlane._proto import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    jobs_pb2,
    jobs_pb2_grpc,
    runs_pb2_grpc,
    workers_pb2_grpc,
    workflows_pb2_grpc,
)
from fastlane.testing.processes import Daemon, WorkerProcess, child_environment

E2E_DIR = Path(__file__).resolve().parent.parent / "e2e"  # where recording_worker.py lives

# What a daemon may answer to any request, valid or not. Anything else fails the suite:
# - UNKNOWN means an exception escaped a servicer unmapped: bad input must be named, not crash;
# - INTERNAL is kept for real bugs, and every one is a finding;
# - UNAVAILABLE is only right while a node starts, stops or loses its database, and no request
#   is sent during those windows here (the restart is checked separately), so it is a finding too;
# - DEADLINE_EXCEEDED means the daemon hung on a request (every call has a deadline).
ALLOWED_CODES = frozenset({
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,  # a field out of range or malformed; the message names it
    grpc.StatusCode.NOT_FOUND,  # no such job, run or tenant
    grpc.StatusCode.ALREADY_EXISTS,  # (tenant, name) taken by a different spec
    grpc.StatusCode.FAILED_PRECONDITION,  # the job or run is not in a state that allows it
    grpc.StatusCode.ABORTED,  # a concurrent change won
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # a message or a collection over its limit
    grpc.StatusCode.OUT_OF_RANGE,  # e.g. a page token past the end
})
# How a worker stream may end: the same set (OK after the worker half-closes). A stream the test
# cancels itself ends CANCELLED on the client side; that is counted apart, not as an answer.
ALLOWED_STREAM_CODES = ALLOWED_CODES

CALL_TIMEOUT = 15.0  # seconds: any answer slower than this is a hang
# Above the 1 MiB payload and checkpoint limits, so the daemon (not the client) judges them.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]

T = TypeVar("T")

# Every fuzz test's tally, printed together at the end of the session.
TALLIES: list[dict[str, Any]] = []


# -- describing requests ---------------------------------------------------------------------------


def describe(message: Message, limit: int = 60) -> dict[str, Any]:
    """A message as a dict for reports, with long strings, bytes and lists cut short."""
    described: dict[str, Any] = {}
    for descriptor, value in message.ListFields():
        if descriptor.is_repeated:
            items = [_describe_value(item, limit) for item in list(value)[:5]]
            if len(value) > 5:
                items.append(f"... {len(value)} items in all")
            described[descriptor.name] = items
        else:
            described[descriptor.name] = _describe_value(value, limit)
    return described


def _describe_value(value: Any, limit: int) -> Any:
    if isinstance(value, Message):
        return describe(value, limit)
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} {'chars' if isinstance(value, str) else 'bytes'})"
    if isinstance(value, bytes):
        return repr(value)
    if isinstance(value, float) and value != value:
        return "NaN"
    return value


# -- counting answers ------------------------------------------------------------------------------


class Tally:
    """Answers counted by status code, and every answer outside the allowed set grouped by
    (RPC, fuzzed fields, code) with one example request and message each."""

    def __init__(self, backend: str, test: str, allowed: frozenset[grpc.StatusCode]) -> None:
        self.backend = backend
        self.test = test
        self.allowed = allowed
        self.codes: Counter[str] = Counter()
        self.by_rpc: dict[str, Counter[str]] = defaultdict(Counter)
        self.problems: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.unnamed: dict[tuple[str, str], dict[str, Any]] = {}
        self.notes: dict[str, Any] = {}
        self.started = time.monotonic()
        self.seconds = 0.0

    @property
    def requests(self) -> int:
        return sum(self.codes.values())

    def record(self, rpc: str, fields: tuple[str, ...], request: Message | dict[str, Any],
               code: grpc.StatusCode | str, details: str, *, expected: bool | None = None,
               check_named: bool = True) -> None:
        """Count one answer. ``code`` may be a label (a str) for an outcome that is no status,
        e.g. a stream that never ended; it is a problem unless ``expected``. With ``check_named``,
        an INVALID_ARGUMENT whose message names none of ``fields`` is noted (not failed)."""
        name = code if isinstance(code, str) else code.name
        self.codes[name] += 1
        self.by_rpc[rpc][name] += 1
        allowed = expected if expected is not None else (not isinstance(code, str) and code in self.allowed)
        if not allowed:
            key = (rpc, ",".join(fields) or "(valid request)", name)
            entry = self.problems.setdefault(key, {"count": 0})
            entry["count"] += 1
            if "example" not in entry:
                entry["example"] = request if isinstance(request, dict) else describe(request)
                entry["details"] = details[:500]
        elif (check_named and code == grpc.StatusCode.INVALID_ARGUMENT and fields
              and not any(_named(f, details) for f in fields)):
            # Reported, not failed: the message should name the field that was wrong.
            key = (rpc, ",".join(fields))
            entry = self.unnamed.setdefault(key, {"count": 0})
            entry["count"] += 1
            entry.setdefault("example", request if isinstance(request, dict) else describe(request))
            entry.setdefault("details", details[:300])

    def finish(self) -> None:
        """Stop the clock of the fuzzing itself (later checks are timed in ``notes``)."""
        if not self.seconds:
            self.seconds = time.monotonic() - self.started

    def as_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "test": self.test,
            "seconds": round(self.seconds, 1),
            "requests": self.requests,
            "codes": dict(self.codes.most_common()),
            "by_rpc": {rpc: dict(codes.most_common()) for rpc, codes in sorted(self.by_rpc.items())},
            "unexpected": [
                {"rpc": rpc, "fields": fields, "code": code, **entry}
                for (rpc, fields, code), entry in sorted(self.problems.items())
            ],
            "invalid_argument_not_naming_the_field": [
                {"rpc": rpc, "fields": fields, **entry} for (rpc, fields), entry in sorted(self.unnamed.items())
            ],
            "notes": self.notes,
        }

    def table(self) -> str:
        lines = [f"fuzz answers, {self.test} on {self.backend}: {self.requests} in {self.seconds:.1f} s"]
        lines += [f"  {code:<22} {count:>6}" for code, count in self.codes.most_common()]
        for (rpc, fields, code), entry in sorted(self.problems.items()):
            lines.append(f"  ! {code} x{entry['count']} {rpc} [{fields}]: {entry['details'][:160]}")
        return "\n".join(lines)

    def write(self, directory: Path) -> Path:
        path = directory / f"fuzz-{self.test}-{self.backend}.json"
        path.write_bytes(orjson.dumps(self.as_json(), option=orjson.OPT_INDENT_2, default=str))
        return path

    def failures(self) -> str:
        """Every answer outside the allowed set, one line per group with its example."""
        return "\n".join(
            f"{code} x{entry['count']} from {rpc} fuzzing [{fields}]: {entry['details']}\n"
            f"    example request: {json.dumps(entry['example'], default=str)[:1500]}"
            for (rpc, fields, code), entry in sorted(self.problems.items())
        )


def _named(field: str, details: str) -> bool:
    """Whether an error message names the field, or the message that holds it (``cron`` for
    ``spec.schedule.cron.timezone``: a timezone without an expression is a bad cron)."""
    return any(part in details for part in field.removesuffix("(reused)").split(".")[-2:])


# -- processes -------------------------------------------------------------------------------------


class Recorder(WorkerProcess):
    """tests/e2e/recording_worker.py in its own process: every run it receives is a JSON line."""

    def __init__(self, address: str, record_path: Path, log_path: Path) -> None:
        self.record_path = record_path
        env = child_environment(E2E_DIR, FASTLANE_RECORD_FILE=str(record_path))
        super().__init__("recording_worker:worker", [address], log_path, env=env)

    def received(self) -> list[dict[str, Any]]:
        if not self.record_path.exists():
            return []
        return [orjson.loads(line) for line in self.record_path.read_bytes().splitlines() if line.strip()]

    def job_ids(self) -> set[str]:
        return {entry["job_id"] for entry in self.received()}


class LoopThread:
    """An asyncio event loop running in a daemon thread; ``run`` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-client-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT + 30) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


class FuzzNode:
    """A daemon (``fastlane serve``) and a recording worker on one database, with a client."""

    def __init__(self, backend: str, db_url: str, directory: Path) -> None:
        self.backend = backend
        self.db_url = db_url
        self.directory = directory
        self.loop = LoopThread()
        self.daemon: Daemon | None = None
        self.recorder: Recorder | None = None
        self.channel: grpc.aio.Channel | None = None
        self.generation = 0
        self.stubs: dict[str, Any] = {}

    # lifecycle

    def start(self) -> None:
        self.generation += 1
        self.daemon = Daemon(self.db_url, self.directory / f"daemon-{self.generation}.log")
        self.daemon.start()
        self.loop.run(self._connect(self.daemon.address))
        self.wait_serving(60.0)
        self.recorder = Recorder(self.daemon.address, self.directory / f"received-{self.generation}.jsonl",
                                 self.directory / f"worker-{self.generation}.log")
        self.recorder.start()
        self.wait_for(lambda: self.workers_connected() >= 1, 30.0, "the recording worker to connect")

    def stop_daemon(self) -> int | None:
        """SIGTERM the daemon (and its recorder); the daemon's exit code."""
        assert self.daemon is not None and self.recorder is not None
        self.recorder.stop()
        code = self.daemon.stop()
        self.loop.run(self._disconnect())
        return code

    def restart(self) -> int | None:
        """Stop the daemon with SIGTERM and start a new one on the same database."""
        code = self.stop_daemon()
        self.start()
        return code

    def close(self) -> None:
        try:
            self.loop.run(self._disconnect(), timeout=15)
        finally:
            for process in (self.recorder, self.daemon):
                if process is not None:
                    process.stop()
            self.loop.close()

    async def _connect(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stubs = {
            "JobService": jobs_pb2_grpc.JobServiceStub(self.channel),
            "RunService": runs_pb2_grpc.RunServiceStub(self.channel),
            "AdminService": admin_pb2_grpc.AdminServiceStub(self.channel),
            "WorkflowService": workflows_pb2_grpc.WorkflowServiceStub(self.channel),
            "WorkerService": workers_pb2_grpc.WorkerServiceStub(self.channel),
            "Health": health_pb2_grpc.HealthStub(self.channel),
        }

    async def _disconnect(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    # state

    def alive(self) -> bool:
        return self.daemon is not None and self.daemon.popen is not None and self.daemon.popen.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        return self.daemon.log_tail(lines) if self.daemon else ""

    def log_errors(self, limit: int = 20) -> list[str]:
        """The daemon's log lines at level error or worse (the node writes JSON lines), last first,
        each with the end of its traceback."""
        if self.daemon is None:
            return []
        found = []
        for line in reversed(self.daemon.log_tail(100_000).splitlines()):
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                if "Error" in line or "Traceback" in line:
                    found.append(line[-1000:])
                continue
            if isinstance(entry, dict) and entry.get("level") in ("error", "critical"):
                traceback_end = str(entry.get("exc", ""))[-1500:]
                found.append(f"{entry.get('ts')} {entry.get('logger')}: {entry.get('msg')}\n{traceback_end}")
            if len(found) >= limit:
                break
        return found

    def health(self) -> str:
        """The daemon's overall gRPC health status name, or the error code name."""
        async def check() -> str:
            try:
                response = await self.stubs["Health"].Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            except grpc.aio.AioRpcError as error:
                return error.code().name
            return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

        return self.loop.run(check())

    def wait_serving(self, timeout: float) -> None:
        self.wait_for(lambda: self.health() == "SERVING", timeout, "the daemon to report SERVING")

    def workers_connected(self) -> int:
        try:
            status = self.unary("AdminService", "GetCluster", admin_pb2.GetClusterRequest())
        except grpc.aio.AioRpcError:
            return 0
        return sum(node.workers_connected for node in status.nodes)

    def wait_for(self, condition: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if not self.alive():
                raise AssertionError(f"the daemon died waiting for {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{self.log_tail(20)}")
            time.sleep(interval)

    # calls

    def unary(self, service: str, method: str, request: Message, timeout: float = CALL_TIMEOUT) -> Any:
        """Call an RPC; raises grpc.aio.AioRpcError on a non-OK status."""
        async def call() -> Any:  # the call object is made on the client's loop
            return await getattr(self.stubs[service], method)(request, timeout=timeout)

        return self.loop.run(call())

    def answer(self, service: str, method: str, request: Message) -> tuple[grpc.StatusCode, str, Message | None]:
        """Call an RPC; (status code, details, response or None)."""
        try:
            return grpc.StatusCode.OK, "", self.unary(service, method, request)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or "", None

    def create_live_job(self, name: str, *, schedule: common_pb2.Schedule, lease_ttl_seconds: int = 5) -> str:
        spec = common_pb2.JobSpec(tenant="canary", name=name, job_type="e2e", schedule=schedule, payload=b"{}")
        spec.lease_ttl.seconds = lease_ttl_seconds
        response = self.unary("JobService", "CreateJob", jobs_pb2.CreateJobRequest(spec=spec))
        return response.job.job_id

    def canary(self, label: str, *, lead: float = 2.0, within: float = 8.0) -> float:
        """A job at ``lead`` seconds ahead must reach the recording worker at most ``within``
        seconds after its time. Returns how late it arrived, in seconds."""
        assert self.recorder is not None
        schedule = common_pb2.Schedule()
        schedule.at.FromNanoseconds(int((time.time() + lead) * 1e9))
        due = schedule.at.ToNanoseconds() / 1e9
        job_id = self.create_live_job(f"canary-{label}-{time.time_ns()}", schedule=schedule)
        recorder = self.recorder
        self.wait_for(lambda: job_id in recorder.job_ids(), lead + within,
                      f"the canary job {job_id} ({label}) to reach the recording worker")
        entry = next(e for e in recorder.received() if e["job_id"] == job_id)
        from datetime import datetime

        return datetime.fromisoformat(entry["received_at"]).timestamp() - due

    def check_survived(self, tally: Tally) -> None:
        """After the fuzzing: alive and SERVING, a canary fires on time, and after a SIGTERM a new
        daemon on the same database comes up SERVING and fires a canary too."""
        assert self.alive(), f"the daemon died during the fuzzing:\n{self.log_tail()}"
        assert self.health() == "SERVING", f"health is {self.health()} after the fuzzing\n{self.log_tail(20)}"
        tally.notes["canary_late_seconds"] = round(self.canary("after-fuzz"), 3)
        exit_code = self.restart()
        tally.notes["sigterm_exit_code"] = exit_code
        assert exit_code == 0, f"the daemon exited {exit_code} on SIGTERM after the fuzzing:\n{self.log_tail()}"
        time.sleep(1.0)  # a node that crash-loops on stored poison would die about now
        assert self.alive(), f"the restarted daemon died:\n{self.log_tail()}"
        assert self.health() == "SERVING"
        tally.notes["canary_after_restart_late_seconds"] = round(self.canary("after-restart"), 3)
        assert self.alive(), f"the restarted daemon died:\n{self.log_tail()}"


def report(tally: Tally, directory: Path, node: FuzzNode) -> None:
    """Print the tally (seen with ``pytest -s``), write it as JSON and keep it for the summary.

    pytest keeps only the last few temporary directories; with FASTLANE_FUZZ_REPORT_DIR set, the
    JSON is also written there, to outlive them.
    """
    tally.finish()
    tally.notes["total_seconds"] = round(time.monotonic() - tally.started, 1)
    if not node.alive():
        tally.notes["daemon_log_errors"] = node.log_errors()
    path = tally.write(directory)
    if os.environ.get("FASTLANE_FUZZ_REPORT_DIR"):
        keep = Path(os.environ["FASTLANE_FUZZ_REPORT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        tally.write(keep)
    print(f"\n{tally.table()}\n  written to {path}")
    TALLIES.append({**tally.as_json(), "path": str(path)})
