"""Seeded random and boundary requests for every RPC of a fastlane daemon.

A strategy here draws a :class:`Probe`: the RPC to call, the fields that carry a fuzzed value (so
answers can be grouped by field) and a function that builds the request from what the run has
learnt so far (:class:`Memory`: ids of jobs and runs that exist, page tokens the daemon handed
out), so that NOT_FOUND is not the only answer an id ever gets. Most requests start from a valid
one and replace one to three fields, so the field to blame is known; some stay valid, and some of
those create jobs that really fire on the recording worker (job type ``e2e``).

Huge values (64 KiB strings, 1 MiB payloads) are built once here and sampled, never drawn byte by
byte: hypothesis would spend its whole budget generating them.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

import orjson
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import strategies as st

from fastlane._proto import admin_pb2, common_pb2, jobs_pb2, runs_pb2, workers_pb2, workflows_pb2

# The job type the recording worker handles: jobs of this type really run.
LIVE_JOB_TYPE = "e2e"
LIVE_TENANT = "fuzz-live"

T = TypeVar("T")

# -- boundary values -----------------------------------------------------------------------------

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

INT32_EDGES = (0, 1, -1, 2, 5, 99, 100, 101, 999, 1000, 1001, 10_000, 10_001, -1000, -1001,
               INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1)
INT64_EDGES = (0, 1, -1, INT64_MAX, INT64_MIN, 2**62, -(2**62), 2**31, 2**53 + 1)


def _epoch_seconds(year: int, month: int = 1, day: int = 1) -> int:
    return int((datetime(year, month, day, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())


YEAR_1 = _epoch_seconds(1)  # -62135596800: the smallest Timestamp protobuf allows
YEAR_9999_END = _epoch_seconds(9999, 12, 31) + 86_399  # 253402300799: the largest
TIMESTAMP_SECONDS_EDGES = (
    0, -1, 1, YEAR_1, YEAR_1 - 1, YEAR_9999_END, YEAR_9999_END + 1, _epoch_seconds(9999),
    _epoch_seconds(9000), _epoch_seconds(9000) - 1, _epoch_seconds(8999, 12, 31), _epoch_seconds(3000),
    _epoch_seconds(2038, 1, 19), _epoch_seconds(1969, 12, 31), 2**62, -(2**62), INT64_MAX, INT64_MIN,
    2**31, -(2**31),
)
NANOS_EDGES = (0, 1, -1, 999_999_999, 1_000_000_000, -999_999_999, -1_000_000_000, INT32_MAX, INT32_MIN)

YEAR_SECONDS = 31_556_952  # a Gregorian year
DURATION_SECONDS_EDGES = (
    0, 1, -1, 2, 3, 30, 60, 86_400, 10**18, -(10**18), 315_576_000_000, 315_576_000_001, -315_576_000_000,
    8_000 * YEAR_SECONDS, 9_000 * YEAR_SECONDS, 100 * 366 * 86_400, 100 * 366 * 86_400 + 1, 7 * 86_400 + 1,
    30 * 86_400 + 1, 366 * 86_400 + 1, INT64_MAX, INT64_MIN, 2**62,
)

CONTROL = "".join(map(chr, range(32))) + "\x7f"
STRING_EDGES = (
    "", "a", "A", "0", "-", ".", "_x", " ", "  padded  ", "a" * 200, "a" * 201, "é" * 201, "x" * 65_536,
    "日本語" * 21_846, "\x00", "job\x00id", "\x00" * 200, CONTROL, "line\nbreak", "tab\there", "\x1b[31mred",
    "é", "日本語", "😀", "😀" * 50, "\u202eevil", "\ufeffbom", "\u0301", "../../etc/passwd", "a/b:c@d",
    "%s%n%x", "'; DROP TABLE jobs; --", "null", "None", "default", "fuzz", "e2e", "*", "?",
)
# Enum-like strings: each field's valid values are mixed in where the field is drawn.
ENUM_NOISE = ("", "ACTIVE", " active", "active ", "Active", "unknown", "0", "1", "\x00", "x" * 201)

PAGE_TOKEN_EDGES = ("", "5b5d", "5b", "7b7d", "00", "zz", "====", "e30=", "W10=", "eyJ", "-1", "0", "1",
                    "x" * 201, "x" * 65_536, "\x00", "ffffffffffffffffffffffffffffffff")

MIB = 1 << 20
BYTES_EDGES = (b"", b"{}", b"[]", b"null", b'{"k": 1}', b"\x00" * 16, b"\xff\xfe\x00", bytes(range(256)),
               b"x" * 65_536, b"x" * (MIB - 1), b"x" * MIB, b"x" * (MIB + 1), b"x" * (MIB + 4096))

FLOAT_EDGES = (math.nan, -math.nan, math.inf, -math.inf, -1.0, 2.0, 0.0, -0.0, 1.0, 0.5, 1e-45, 1.0000001,
               3.4e38, -3.4e38)

# The API's enumerations by their wire values, the unspecified zero included (a default or "any").
OVERLAPS = tuple(common_pb2.OverlapPolicy.values())
DELIVERIES = tuple(common_pb2.Delivery.values())
MISFIRE_KINDS = tuple(common_pb2.MisfireKind.values())
JOB_STATES = tuple(common_pb2.JobState.values())
RUN_STATES = tuple(value for value in common_pb2.RunState.values() if value)
RUN_ACTIONS = tuple(runs_pb2.RunAction.values())
JOB_ACTIONS = tuple(jobs_pb2.JobAction.values())
WORKER_OUTCOMES = (common_pb2.ATTEMPT_OUTCOME_SUCCEEDED, common_pb2.ATTEMPT_OUTCOME_FAILED,
                   common_pb2.ATTEMPT_OUTCOME_PERMANENT_FAILURE, common_pb2.ATTEMPT_OUTCOME_TIMED_OUT,
                   common_pb2.ATTEMPT_OUTCOME_CANCELLED)  # what a worker may report; the rest count as failed
OUTCOMES = tuple(common_pb2.AttemptOutcome.values())
INT32_EDGES = (-1, 2**31 - 1, -(2**31))
CRON_EDGES = ("* * * * *", "*/5 * * * *", "0 9 * * 1-5", "30 */2 * * * *", "0 0 31 2 *", "0 0 29 2 *",
              "0 0 30 2 *", "60 * * * *", "* 24 * * *", "* * 32 * *", "* * * 13 *", "* * * * 8", "*/0 * * * *",
              "@yearly", "@reboot", "* * * * * * *", "* * * *", "", " ", "a b c d e", "0-59/1 * * * *",
              "59 23 31 12 *", "0 2 * * *", "30 2 * * 0", "1-100000 * * * *", "*" * 201, "* * * * *\x00")
TIMEZONE_EDGES = ("", "UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu",
                  "Etc/GMT+12", "Etc/GMT-14", "Mars/Olympus", "utc", "../../etc/passwd", "/etc/localtime",
                  "Europe/Paris\x00", "x" * 65, "posixrules", "localtime", "Factory", "EST5EDT")


def int32s() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(INT32_EDGES), st.integers(INT32_MIN, INT32_MAX))


def int64s() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(INT64_EDGES), st.integers(INT64_MIN, INT64_MAX))


def random_text(max_size: int = 40) -> st.SearchStrategy[str]:
    # Lone surrogates cannot be encoded as UTF-8: the client would refuse them, not the daemon.
    return st.text(st.characters(exclude_categories=("Cs",)), max_size=max_size)


def strings() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(STRING_EDGES), random_text())


def enum_numbers(valid: tuple[int, ...]) -> st.SearchStrategy[int]:
    """An enumeration's values, the next one past them (a newer client's), and any int32: proto3
    enums are open, so a node receives numbers no member names."""
    return st.one_of(st.sampled_from(valid), st.sampled_from((max(valid) + 1, *INT32_EDGES)),
                     st.integers(-(2**31), 2**31 - 1))


def byte_strings() -> st.SearchStrategy[bytes]:
    return st.one_of(st.sampled_from(BYTES_EDGES), st.binary(max_size=64))


def floats32() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(FLOAT_EDGES), st.floats(width=32))


def timestamps() -> st.SearchStrategy[Timestamp]:
    """Protobuf Timestamps at the edges of every range involved, and anywhere in int64."""
    now = int(time.time())
    seconds = st.one_of(
        st.sampled_from(TIMESTAMP_SECONDS_EDGES),
        st.sampled_from((now, now + 2, now - 86_400, now + 86_400 * 365)),
        st.integers(INT64_MIN, INT64_MAX),
        st.integers(YEAR_1, YEAR_9999_END),
    )
    nanos = st.one_of(st.just(0), st.sampled_from(NANOS_EDGES), st.integers(INT32_MIN, INT32_MAX))
    return st.builds(Timestamp, seconds=seconds, nanos=nanos)


def durations() -> st.SearchStrategy[Duration]:
    seconds = st.one_of(st.sampled_from(DURATION_SECONDS_EDGES), st.integers(INT64_MIN, INT64_MAX),
                        st.integers(-(10**6), 10**6))
    nanos = st.one_of(st.just(0), st.sampled_from((*NANOS_EDGES, 100_000_000, 1_000)),
                      st.integers(INT32_MIN, INT32_MAX))
    return st.builds(Duration, seconds=seconds, nanos=nanos)


def _now_plus(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int((time.time() + seconds) * 1e9))
    return stamp


# -- what a run learns ---------------------------------------------------------------------------


# The answers that carry one job, one run or one workflow run, whose ids a later probe reuses.
JOB_ANSWERS = (jobs_pb2.CreateJobResponse, jobs_pb2.GetJobResponse, jobs_pb2.UpdateJobResponse,
               jobs_pb2.PauseJobResponse, jobs_pb2.ResumeJobResponse)
RUN_ANSWERS = (jobs_pb2.TriggerJobResponse, runs_pb2.GetRunResponse, runs_pb2.CancelRunResponse,
               runs_pb2.RetryRunResponse)
WORKFLOW_RUN_ANSWERS = (workflows_pb2.TriggerWorkflowResponse, workflows_pb2.GetWorkflowRunResponse,
                        workflows_pb2.CancelWorkflowRunResponse, workflows_pb2.ResumeWorkflowRunResponse)


@dataclass
class Memory:
    """Ids and tokens the daemon gave out during one fuzz run, for requests that name real things."""

    jobs: list[tuple[str, str, str]] = field(default_factory=list)  # (tenant, job_id, name)
    runs: list[tuple[str, str]] = field(default_factory=list)  # (tenant, run_id)
    page_tokens: list[str] = field(default_factory=list)
    live_jobs: list[str] = field(default_factory=list)  # job ids of valid jobs that fire on the recorder
    workflow_runs: list[str] = field(default_factory=list)
    storms_left: int = 4  # always-failing jobs with 100+ attempts: heavy, so only a few per run
    _names: itertools.count = field(default_factory=itertools.count)

    def unique_name(self, prefix: str) -> str:
        return f"{prefix}-{next(self._names)}"

    def job(self, index: int) -> tuple[str, str, str] | None:
        return self.jobs[index % len(self.jobs)] if self.jobs else None

    def run(self, index: int) -> tuple[str, str] | None:
        return self.runs[index % len(self.runs)] if self.runs else None

    def page_token(self, index: int) -> str:
        return self.page_tokens[index % len(self.page_tokens)] if self.page_tokens else "5b5d"

    def learn(self, response: Message) -> None:
        """Remember the ids and tokens in a successful answer."""
        if isinstance(response, WORKFLOW_RUN_ANSWERS):
            if response.run.workflow_run_id not in self.workflow_runs[-50:]:
                self.workflow_runs = [*self.workflow_runs[-499:], response.run.workflow_run_id]
        elif isinstance(response, JOB_ANSWERS):
            self._job(response.job)
        elif isinstance(response, RUN_ANSWERS):
            self._run(response.run)
        elif isinstance(response, jobs_pb2.ListJobsResponse):
            for job in response.jobs[:20]:
                self._job(job)
            self._token(response.next_page_token)
        elif isinstance(response, runs_pb2.ListRunsResponse):
            for run in response.runs[:20]:
                self._run(run)
            self._token(response.next_page_token)

    def _job(self, job: common_pb2.Job) -> None:
        entry = (job.spec.tenant, job.job_id, job.spec.name)
        if job.job_id and entry not in self.jobs[-50:]:
            self.jobs = [*self.jobs[-499:], entry]

    def _run(self, run: common_pb2.Run) -> None:
        entry = (run.tenant, run.run_id)
        if run.run_id and entry not in self.runs[-50:]:
            self.runs = [*self.runs[-499:], entry]

    def _token(self, token: str) -> None:
        if token:
            self.page_tokens = [*self.page_tokens[-99:], token]


@dataclass(frozen=True)
class Probe:
    """One request: the RPC, the fuzzed fields (empty: a valid request) and how to build it."""

    service: str
    method: str
    fields: tuple[str, ...]
    build: Callable[[Memory], Message]
    live: bool = False  # a valid job that should fire on the recording worker

    @property
    def rpc(self) -> str:
        return f"{self.service}/{self.method}"


# -- mutations: each replaces one field of a message with a fuzzed value ---------------------------

Mutator = Callable[[Message], None]


def _setter(path: str, values: st.SearchStrategy[object]) -> st.SearchStrategy[Mutator]:
    """A mutator setting the scalar or message field at dotted ``path`` (from the mutated message)."""
    *owners, leaf = path.split(".")

    def make(value: object) -> Mutator:
        def mutate(message: Message) -> None:
            for owner in owners:
                message = getattr(message, owner)
            if isinstance(value, Message):
                getattr(message, leaf).CopyFrom(value)
            else:
                setattr(message, leaf, value)
        return mutate

    return values.map(make)


def _clear(path: str) -> st.SearchStrategy[Mutator]:
    *owners, leaf = path.split(".")

    def mutate(message: Message) -> None:
        for owner in owners:
            message = getattr(message, owner)
        message.ClearField(leaf)

    return st.just(mutate)


SCHEDULE_MUTATIONS: dict[str, st.SearchStrategy[Mutator]] = {
    "schedule": _clear("kind"),  # no kind at all
    "schedule.at": _setter("at", timestamps()),
    "schedule.cron.expression": _setter("cron.expression", st.one_of(st.sampled_from(CRON_EDGES), strings())),
    "schedule.cron.timezone": _setter("cron.timezone", st.one_of(st.sampled_from(TIMEZONE_EDGES), strings())),
    "schedule.interval.every": _setter("interval.every", durations()),
    "schedule.interval.anchor": _setter("interval.anchor", timestamps()),
    "schedule.jitter": _setter("jitter", durations()),
}

SPEC_MUTATIONS: dict[str, st.SearchStrategy[Mutator]] = {
    "spec.tenant": _setter("tenant", strings()),
    "spec.name": _setter("name", strings()),
    "spec.job_type": _setter("job_type", strings()),
    "spec.payload": _setter("payload", byte_strings()),
    "spec.priority": _setter("priority", int32s()),
    "spec.concurrency_key": _setter("concurrency_key", strings()),
    "spec.concurrency_limit": _setter("concurrency_limit", int32s()),
    "spec.retry.max_attempts": _setter("retry.max_attempts", int32s()),
    "spec.retry.max_retry_time": _setter("retry.max_retry_time", durations()),
    "spec.retry.backoff_base": _setter("retry.backoff_base", durations()),
    "spec.retry.backoff_cap": _setter("retry.backoff_cap", durations()),
    "spec.misfire.kind": _setter("misfire.kind", enum_numbers(MISFIRE_KINDS)),
    "spec.misfire.grace": _setter("misfire.grace", durations()),
    "spec.misfire.fire_all_cap": _setter("misfire.fire_all_cap", int32s()),
    "spec.overlap": _setter("overlap", enum_numbers(OVERLAPS)),
    "spec.delivery": _setter("delivery", enum_numbers(DELIVERIES)),
    "spec.timeout": _setter("timeout", durations()),
    "spec.lease_ttl": _setter("lease_ttl", durations()),
    "spec.schedule": _clear("schedule"),
    "spec.retry": _clear("retry"),
    "spec.misfire": _clear("misfire"),
}


def _schedule_mutator(path: str) -> st.SearchStrategy[Mutator]:
    inner = SCHEDULE_MUTATIONS[path]

    def on_spec(mutate: Mutator) -> Mutator:
        return lambda spec: mutate(spec.schedule)  # type: ignore[attr-defined]

    return inner.map(on_spec)


SPEC_MUTATIONS.update({f"spec.{path}": _schedule_mutator(path) for path in SCHEDULE_MUTATIONS if path != "schedule"})
SPEC_MUTATIONS["spec.schedule.kind"] = _schedule_mutator("schedule")

# How many fields a request has fuzzed: 0 (valid) about one time in seven.
MUTATION_COUNTS = (0, 1, 1, 1, 1, 2, 2, 3)


@st.composite
def _mutations(draw: st.DrawFn, table: dict[str, st.SearchStrategy[Mutator]]) -> list[tuple[str, Mutator]]:
    count = draw(st.sampled_from(MUTATION_COUNTS))
    paths = draw(st.lists(st.sampled_from(sorted(table)), min_size=count, max_size=count, unique=True))
    return [(path, draw(table[path])) for path in paths]


# -- valid starting points -------------------------------------------------------------------------


@st.composite
def valid_schedules(draw: st.DrawFn) -> common_pb2.Schedule:
    kind = draw(st.sampled_from(("now", "at", "cron", "interval")))
    if kind == "now":
        return common_pb2.Schedule(now=common_pb2.Now())
    if kind == "at":
        # An hour to a year ahead: valid, but never fires during the run (no worker load).
        return common_pb2.Schedule(at=_now_plus(draw(st.integers(3600, 365 * 86_400))))
    if kind == "cron":
        return common_pb2.Schedule(cron=common_pb2.Cron(
            expression=draw(st.sampled_from(("*/5 * * * *", "0 9 * * 1-5", "30 0 */2 * * *", "0 0 1 1 *"))),
            timezone=draw(st.sampled_from(("", "UTC", "Europe/Paris", "America/New_York", "Asia/Kathmandu"))),
        ))
    interval = common_pb2.Interval(every=Duration(seconds=draw(st.sampled_from((60, 600, 86_400)))))
    if draw(st.booleans()):
        interval.anchor.CopyFrom(_now_plus(-draw(st.integers(0, 86_400))))
    schedule = common_pb2.Schedule(interval=interval)
    if draw(st.booleans()):  # a valid jitter, up to the largest: the fuzzed ones are SCHEDULE_MUTATIONS'
        schedule.jitter.CopyFrom(Duration(seconds=draw(st.sampled_from((1, 30, 3600, 86_400)))))
    return schedule


@st.composite
def valid_specs(draw: st.DrawFn) -> common_pb2.JobSpec:
    """A spec the daemon accepts; job type ``fuzz`` has no worker, so its runs only queue up."""
    spec = common_pb2.JobSpec(
        tenant=draw(st.sampled_from(("", "default", "fuzz-tenant"))),
        name=f"fuzz-{draw(st.integers(0, 300))}",  # repeats: the idempotent and ALREADY_EXISTS paths
        job_type=draw(st.sampled_from(("fuzz", "fuzz.other"))),
        schedule=draw(valid_schedules()),
        payload=draw(st.sampled_from((b"", b"{}", b'{"k": 1}'))),
        priority=draw(st.sampled_from((0, 5, -1000, 1000))),
        overlap=draw(st.sampled_from(OVERLAPS)),
        delivery=draw(st.sampled_from(DELIVERIES)),
    )
    if draw(st.booleans()):
        spec.retry.CopyFrom(common_pb2.RetryPolicy(
            max_attempts=draw(st.sampled_from((0, 1, 3, 1000))),
            backoff_base=Duration(seconds=1), backoff_cap=Duration(seconds=60)))
    if draw(st.booleans()):
        spec.misfire.CopyFrom(common_pb2.MisfirePolicy(
            kind=draw(st.sampled_from(MISFIRE_KINDS)), grace=Duration(seconds=10), fire_all_cap=100))
    if draw(st.booleans()):
        spec.timeout.CopyFrom(Duration(seconds=30))
        spec.lease_ttl.CopyFrom(Duration(seconds=draw(st.sampled_from((3, 30, 86_400)))))
    return spec


@st.composite
def fuzzed_specs(draw: st.DrawFn) -> tuple[common_pb2.JobSpec, tuple[str, ...]]:
    spec = draw(valid_specs())
    mutations = draw(_mutations(SPEC_MUTATIONS))
    for _, mutate in mutations:
        mutate(spec)
    return spec, tuple(path for path, _ in mutations)


def live_spec(memory: Memory, kind: str) -> common_pb2.JobSpec:
    """A valid job of the recording worker's type that fires within seconds of the request."""
    spec = common_pb2.JobSpec(tenant=LIVE_TENANT, name=memory.unique_name(f"live-{kind}"), job_type=LIVE_JOB_TYPE,
                              payload=b"{}", lease_ttl=Duration(seconds=5))
    if kind == "now":
        spec.schedule.now.SetInParent()
    elif kind == "at":
        spec.schedule.at.CopyFrom(_now_plus(2))
    elif kind == "interval":
        spec.schedule.interval.every.CopyFrom(Duration(seconds=10))
    elif kind == "storm" and memory.storms_left > 0:
        # Always fails, retried at once: the "max_attempts 100 with an always-failing worker" probe.
        memory.storms_left -= 1
        spec.schedule.now.SetInParent()
        spec.payload = b'{"fail_until_attempt": 100000}'
        spec.retry.CopyFrom(common_pb2.RetryPolicy(
            max_attempts=100, backoff_base=Duration(nanos=1_000_000), backoff_cap=Duration(nanos=10_000_000)))
    else:
        spec.schedule.now.SetInParent()
    return spec


# -- one strategy per RPC --------------------------------------------------------------------------

KNOWN = object()  # "use an id the daemon gave out" instead of a fuzzed one


def _pick(draw: st.DrawFn, values: st.SearchStrategy[object], fuzz_one_in: int = 3) -> object:
    return draw(values) if draw(st.integers(1, fuzz_one_in)) == 1 else KNOWN


@st.composite
def create_job(draw: st.DrawFn) -> Probe:
    live = draw(st.integers(1, 8)) == 1
    if live:
        kind = draw(st.sampled_from(("now", "now", "at", "at", "interval", "storm")))
        return Probe("JobService", "CreateJob", (),
                     lambda memory: jobs_pb2.CreateJobRequest(spec=live_spec(memory, kind)), live=True)
    spec, fields = draw(fuzzed_specs())
    return Probe("JobService", "CreateJob", fields, lambda memory: jobs_pb2.CreateJobRequest(spec=spec))


@st.composite
def update_job(draw: st.DrawFn) -> Probe:
    spec, fields = draw(fuzzed_specs())
    job_id = _pick(draw, strings(), fuzz_one_in=4)
    index = draw(st.integers(0, 10**6))

    def build(memory: Memory) -> Message:
        fuzzed_id = "" if job_id is KNOWN else job_id
        request = jobs_pb2.UpdateJobRequest(job_id=fuzzed_id, spec=spec)  # type: ignore[arg-type]
        known = memory.job(index)
        if job_id is KNOWN and known:
            tenant, request.job_id, name = known
            if "spec.tenant" not in fields:
                request.spec.tenant = tenant
            if "spec.name" not in fields:
                request.spec.name = name
        return request

    return Probe("JobService", "UpdateJob", (*fields, *(() if job_id is KNOWN else ("job_id",))), build)


@st.composite
def job_ref(draw: st.DrawFn, method: str) -> Probe:
    tenant = _pick(draw, strings(), fuzz_one_in=5)
    job_id = _pick(draw, strings(), fuzz_one_in=3)
    index = draw(st.integers(0, 10**6))

    # A pause takes a reason: the boundary strings, or none.
    reason = draw(st.one_of(st.just(""), strings(), st.just("r" * 201))) if method == "PauseJob" else ""

    def build(memory: Memory) -> Message:
        known = memory.job(index) or ("", "no-such-job", "")
        request = getattr(jobs_pb2, f"{method}Request")(tenant=known[0] if tenant is KNOWN else tenant,
                                                        job_id=known[1] if job_id is KNOWN else job_id)
        if reason:
            request.reason = reason
        return request

    fields = tuple(name for name, value in (("tenant", tenant), ("job_id", job_id)) if value is not KNOWN)
    return Probe("JobService", method, fields + (("reason",) if reason else ()), build)


@st.composite
def list_jobs(draw: st.DrawFn) -> Probe:
    request = jobs_pb2.ListJobsRequest(tenant=draw(st.sampled_from(("", "default", "fuzz-tenant", LIVE_TENANT))))
    fields = []
    if draw(st.booleans()):
        request.tenant = draw(strings())
        fields.append("tenant")
    if draw(st.booleans()):
        request.state = draw(enum_numbers(JOB_STATES))
        fields.append("state")
    if draw(st.booleans()):
        request.job_type = draw(strings())
        fields.append("job_type")
    if draw(st.booleans()):
        request.page_size = draw(int32s())
        fields.append("page_size")
    if draw(st.booleans()):
        request.name = draw(st.one_of(strings(), st.just("canary")))
        fields.append("name")
    if draw(st.booleans()):
        request.id_prefix = draw(st.one_of(strings(), st.sampled_from(("0", "0d43", "\U0010ffff", "-"))))
        fields.append("id_prefix")
    if draw(st.booleans()):
        request.name_prefix = draw(st.one_of(strings(), st.sampled_from(("c", "canar", "-", ".", "%", "_", "a" * 201))))
        fields.append("name_prefix")
    token = _pick(draw, st.one_of(st.sampled_from(PAGE_TOKEN_EDGES), strings()), fuzz_one_in=2)
    index = draw(st.integers(0, 10**6))
    # A token handed out for another listing or other filters is a fuzzed value too.
    fields.append("page_token" if token is not KNOWN else "page_token(reused)")

    def build(memory: Memory) -> Message:
        built = jobs_pb2.ListJobsRequest()
        built.CopyFrom(request)
        built.page_token = memory.page_token(index) if token is KNOWN else token  # type: ignore[assignment]
        return built

    return Probe("JobService", "ListJobs", tuple(fields), build)


@st.composite
def preview_schedule(draw: st.DrawFn) -> Probe:
    request = jobs_pb2.PreviewScheduleRequest(schedule=draw(valid_schedules()))
    mutations = draw(_mutations(SCHEDULE_MUTATIONS))
    for _, mutate in mutations:
        mutate(request.schedule)
    fields = [path for path, _ in mutations]
    if draw(st.booleans()):
        request.after.CopyFrom(draw(timestamps()))
        fields.append("after")
    if draw(st.booleans()):
        request.count = draw(int32s())
        fields.append("count")
    if draw(st.integers(1, 3)) == 1:
        request.job_id = draw(st.one_of(strings(), st.sampled_from(("job-1", "a" * 201))))
        fields.append("job_id")
    return Probe("JobService", "PreviewSchedule", tuple(fields), lambda memory: request)


@st.composite
def list_runs(draw: st.DrawFn) -> Probe:
    request = runs_pb2.ListRunsRequest(tenant=draw(st.sampled_from(("", "default", "fuzz-tenant", LIVE_TENANT))))
    fields = []
    if draw(st.booleans()):
        request.tenant = draw(strings())
        fields.append("tenant")
    if draw(st.booleans()):
        request.states.extend(draw(st.one_of(
            st.lists(enum_numbers(RUN_STATES), max_size=4),
            st.sampled_from((list(RUN_STATES) * 2, [common_pb2.RUN_STATE_SCHEDULED] * 1000, [0] * 11, [999] * 11)),
        )))
        fields.append("states")
    if draw(st.booleans()):
        request.page_size = draw(int32s())
        fields.append("page_size")
    if draw(st.booleans()):
        request.id_prefix = draw(st.one_of(strings(), st.sampled_from(("0", "0d43", "\U0010ffff", "-"))))
        fields.append("id_prefix")
    for bound in ("scheduled_from", "scheduled_before"):  # each alone, both, reversed, out of range
        if draw(st.booleans()):
            getattr(request, bound).CopyFrom(draw(timestamps()))
            fields.append(bound)
    if draw(st.booleans()):
        request.job_type = draw(st.one_of(strings(), st.sampled_from(("fuzz", "fuzz-wf", "a" * 201))))
        fields.append("job_type")
    if draw(st.integers(1, 4)) == 1:
        request.backfill_id = draw(st.one_of(strings(), st.sampled_from(("a" * 201, "b\x00f"))))
        fields.append("backfill_id")
    job_id = _pick(draw, strings(), fuzz_one_in=2)
    token = _pick(draw, st.one_of(st.sampled_from(PAGE_TOKEN_EDGES), strings()), fuzz_one_in=2)
    index = draw(st.integers(0, 10**6))
    fields += ["job_id"] if job_id is not KNOWN else []
    fields.append("page_token" if token is not KNOWN else "page_token(reused)")

    def build(memory: Memory) -> Message:
        built = runs_pb2.ListRunsRequest()
        built.CopyFrom(request)
        known = memory.job(index)
        built.job_id = (known[1] if known else "") if job_id is KNOWN else job_id  # type: ignore[assignment]
        built.page_token = memory.page_token(index) if token is KNOWN else token  # type: ignore[assignment]
        return built

    return Probe("RunService", "ListRuns", tuple(fields), build)


@st.composite
def act_on_jobs(draw: st.DrawFn) -> Probe:
    """A bulk action on jobs: any action number, any selection, a dry run mostly (so that a fuzz
    run keeps jobs to probe), any limit and page token."""
    request = jobs_pb2.ActOnJobsRequest(tenant=draw(st.sampled_from(("", "default", "fuzz-tenant", LIVE_TENANT))),
                                        action=draw(enum_numbers(JOB_ACTIONS)), dry_run=draw(st.integers(1, 6)) > 1)
    fields = ["action"]
    if draw(st.booleans()):
        request.selection.states.extend(draw(st.lists(enum_numbers(JOB_STATES), max_size=8)))
        fields.append("selection.states")
    if draw(st.booleans()):
        request.selection.job_type = draw(st.one_of(strings(), st.sampled_from(("fuzz", "fuzz-wf", "a" * 201))))
        fields.append("selection.job_type")
    if draw(st.booleans()):
        request.limit = draw(int32s())
        fields.append("limit")
    if token := draw(st.one_of(st.just(""), st.sampled_from(PAGE_TOKEN_EDGES), strings())):
        request.page_token = token
        fields.append("page_token")
    if reason := draw(st.one_of(st.just(""), strings())):
        request.reason = reason
        fields.append("reason")
    return Probe("JobService", "ActOnJobs", tuple(fields), lambda memory: request)


@st.composite
def act_on_runs(draw: st.DrawFn) -> Probe:
    """A bulk action: any action number, any selection, a dry run mostly (so that a fuzz run keeps
    runs to probe), any limit and page token."""
    request = runs_pb2.ActOnRunsRequest(tenant=draw(st.sampled_from(("", "default", "fuzz-tenant", LIVE_TENANT))),
                                        action=draw(enum_numbers(RUN_ACTIONS)), dry_run=draw(st.integers(1, 4)) > 1)
    fields = ["action"]
    selection = request.selection
    if draw(st.booleans()):
        selection.states.extend(draw(st.lists(enum_numbers(RUN_STATES), max_size=12)))
        fields.append("selection.states")
    if draw(st.booleans()):
        selection.job_type = draw(st.one_of(strings(), st.sampled_from(("fuzz", "fuzz-wf", "a" * 201))))
        fields.append("selection.job_type")
    for bound in ("scheduled_from", "scheduled_before"):
        if draw(st.booleans()):
            getattr(selection, bound).CopyFrom(draw(timestamps()))
            fields.append(f"selection.{bound}")
    if draw(st.integers(1, 4)) == 1:
        selection.backfill_id = draw(st.one_of(strings(), st.sampled_from(("a" * 201, "b\x00f"))))
        fields.append("selection.backfill_id")
    if draw(st.booleans()):
        request.limit = draw(int32s())
        fields.append("limit")
    job_id = _pick(draw, strings(), fuzz_one_in=2)
    token = draw(st.one_of(st.just(""), st.sampled_from(PAGE_TOKEN_EDGES), strings()))
    index = draw(st.integers(0, 10**6))
    fields += ["selection.job_id"] if job_id is not KNOWN else []
    fields += ["page_token"] if token else []

    def build(memory: Memory) -> Message:
        built = runs_pb2.ActOnRunsRequest()
        built.CopyFrom(request)
        known = memory.job(index)
        built.selection.job_id = (known[1] if known else "") if job_id is KNOWN else job_id  # type: ignore[assignment]
        built.page_token = token  # type: ignore[assignment]
        return built

    return Probe("RunService", "ActOnRuns", tuple(fields), build)


BACKFILL_MODES = (0, 1, 2)


@st.composite
def backfill_job(draw: st.DrawFn) -> Probe:
    """A backfill: a known job (a one-shot one is refused) or a fuzzed id, any range, mode, overlap,
    limit and page token; a dry run mostly, and a real one over a short past range, so that a fuzz
    run does not fill the node with runs."""
    request = jobs_pb2.BackfillJobRequest(dry_run=draw(st.integers(1, 4)) > 1)
    tenant = _pick(draw, strings(), fuzz_one_in=5)
    fields: list[str] = [] if tenant is KNOWN else ["tenant"]
    for bound, default in (("start", -3600), ("end", -60)):
        if draw(st.integers(1, 3)) == 1:
            getattr(request, bound).CopyFrom(draw(timestamps()))
            fields.append(bound)
        elif draw(st.integers(1, 6)) > 1:
            getattr(request, bound).CopyFrom(_now_plus(default))
    if draw(st.booleans()):
        request.mode = draw(enum_numbers(BACKFILL_MODES))
        fields.append("mode")
    if draw(st.booleans()):
        request.overlap = draw(enum_numbers(OVERLAPS))
        fields.append("overlap")
    if draw(st.booleans()):
        request.limit = draw(int32s())
        fields.append("limit")
    # A token one time in three: the others begin a backfill, so that some reach the write.
    if draw(st.integers(1, 3)) == 1 and (token := draw(st.one_of(st.sampled_from(PAGE_TOKEN_EDGES), strings()))):
        request.page_token = token
        fields.append("page_token")
    job_id = _pick(draw, strings(), fuzz_one_in=3)
    index = draw(st.integers(0, 10**6))
    fields += ["job_id"] if job_id is not KNOWN else []

    def build(memory: Memory) -> Message:
        built = jobs_pb2.BackfillJobRequest()
        built.CopyFrom(request)
        known = memory.job(index) or ("", "no-such-job", "")
        built.tenant = known[0] if tenant is KNOWN else tenant  # type: ignore[assignment]
        built.job_id = known[1] if job_id is KNOWN else job_id  # type: ignore[assignment]
        return built

    return Probe("JobService", "BackfillJob", tuple(fields), build)


@st.composite
def run_ref(draw: st.DrawFn, method: str) -> Probe:
    tenant = _pick(draw, strings(), fuzz_one_in=5)
    run_id = _pick(draw, strings(), fuzz_one_in=3)
    index = draw(st.integers(0, 10**6))

    def build(memory: Memory) -> Message:
        known = memory.run(index) or ("", "no-such-run")
        return getattr(runs_pb2, f"{method}Request")(tenant=known[0] if tenant is KNOWN else tenant,
                                                     run_id=known[1] if run_id is KNOWN else run_id)

    fields = tuple(name for name, value in (("tenant", tenant), ("run_id", run_id)) if value is not KNOWN)
    return Probe("RunService", method, fields, build)


def get_cluster() -> st.SearchStrategy[Probe]:
    return st.just(Probe("AdminService", "GetCluster", (), lambda memory: admin_pb2.GetClusterRequest()))


TOKEN_ROLES = tuple(admin_pb2.Role.values())


@st.composite
def set_quota(draw: st.DrawFn) -> Probe:
    # Always the fuzz tenant's own: a quota set low on the canary's tenant would refuse the canary.
    request = admin_pb2.SetQuotaRequest(tenant="fuzz-tenant", reset=draw(st.booleans()))
    fields = ["reset"] if request.reset else []
    for name, values in (("max_jobs", int64s()), ("max_waiting_runs", int64s()),
                         ("job_creations_per_second", st.floats(allow_nan=True, allow_infinity=True))):
        if draw(st.booleans()):
            setattr(request.override, name, draw(values))
            fields.append(f"override.{name}")
    if draw(st.integers(1, 4)) == 1:
        request.tenant = draw(strings())
        fields.append("tenant")
    if request.tenant in ("canary", LIVE_TENANT, "default"):
        request.tenant = "fuzz-tenant"
    return Probe("AdminService", "SetQuota", tuple(fields), lambda memory: request)


@st.composite
def get_quota(draw: st.DrawFn) -> Probe:
    tenant = draw(st.one_of(st.just(""), strings()))
    return Probe("AdminService", "GetQuota", ("tenant",) if tenant else (),
                 lambda memory: admin_pb2.GetQuotaRequest(tenant=tenant))


@st.composite
def create_token(draw: st.DrawFn) -> Probe:
    request = admin_pb2.CreateTokenRequest(tenant="fuzz-tenant", role=admin_pb2.ROLE_VIEWER, name="fuzz")
    fields = []
    if draw(st.booleans()):
        request.tenant = draw(strings())
        fields.append("tenant")
    if draw(st.booleans()):
        request.role = draw(enum_numbers(TOKEN_ROLES))
        fields.append("role")
    if draw(st.booleans()):
        request.name = draw(strings())
        fields.append("name")
    if draw(st.booleans()):
        request.expires_in.CopyFrom(draw(durations()))
        fields.append("expires_in")
    return Probe("AdminService", "CreateToken", tuple(fields), lambda memory: request)


@st.composite
def token_listing(draw: st.DrawFn) -> Probe:
    tenant = draw(st.one_of(st.just(""), strings()))
    return Probe("AdminService", "ListTokens", ("tenant",) if tenant else (),
                 lambda memory: admin_pb2.ListTokensRequest(tenant=tenant))


@st.composite
def revoke_token(draw: st.DrawFn) -> Probe:
    token_id = draw(strings())
    return Probe("AdminService", "RevokeToken", ("token_id",), lambda memory: admin_pb2.RevokeTokenRequest(
        token_id=token_id))


def api_probes() -> st.SearchStrategy[Probe]:
    """Any request to JobService, RunService or AdminService; CreateJob and UpdateJob, which have
    the most fields, are drawn most often."""
    return st.one_of(
        create_job(), create_job(), create_job(), create_job(),
        update_job(), update_job(),
        job_ref("GetJob"), job_ref("PauseJob"), job_ref("ResumeJob"), job_ref("DeleteJob"), job_ref("TriggerJob"),
        list_jobs(), preview_schedule(), preview_schedule(),
        list_runs(), run_ref("GetRun"), run_ref("CancelRun"), run_ref("RetryRun"), act_on_runs(),
        act_on_jobs(), backfill_job(), backfill_job(),
        get_cluster(), create_token(), token_listing(), revoke_token(), set_quota(), get_quota(),
        create_workflow(), create_workflow(), trigger_workflow(), workflow_run_ref("GetWorkflowRun"),
        workflow_run_ref("CancelWorkflowRun"), workflow_run_ref("ResumeWorkflowRun"), list_workflow_runs(),
    )


# -- workflows ---------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def workflow_step(draw: st.DrawFn, names: list[str]) -> dict[str, object]:
    step: dict[str, object] = {"name": draw(st.sampled_from(names) | strings()), "job_type": "fuzz-wf"}
    if draw(st.booleans()):
        step["after"] = draw(st.lists(st.sampled_from(names) | st.fixed_dictionaries(
            {"step": st.sampled_from(names), "on": st.sampled_from(("on_success", "on_failure", "always", "x"))}),
            max_size=3))
    if draw(st.integers(0, 4)) == 0:
        step["for_each"] = draw(st.sampled_from(("input", "input.items", *names, "nope")) | strings())
    if draw(st.integers(0, 4)) == 0:
        step[draw(st.sampled_from(("retry", "timeout_seconds", "priority", "lease_ttl_seconds", "params", "x")))] = \
            draw(JSON_VALUES)
    return step


@st.composite
def create_workflow(draw: st.DrawFn) -> Probe:
    """A definition that is often valid (a small DAG, maybe cyclic or dangling) and sometimes not JSON at all."""
    names = [f"s{i}" for i in range(draw(st.integers(1, 6)))]
    document: object = {"name": draw(st.sampled_from(("fuzz-flow", "fuzz-flow-2")) | strings()),
                        "steps": draw(st.lists(workflow_step(names), min_size=0, max_size=8))}
    if draw(st.integers(0, 5)) == 0:
        document = draw(JSON_VALUES)
    text = orjson.dumps(document).decode() if draw(st.integers(0, 9)) else draw(strings())
    request = workflows_pb2.CreateWorkflowRequest(tenant=draw(st.sampled_from(("", "default", "fuzz-tenant"))),
                                                  definition=text)
    return Probe("WorkflowService", "CreateWorkflow", ("definition",), lambda memory: request)


@st.composite
def trigger_workflow(draw: st.DrawFn) -> Probe:
    request = workflows_pb2.TriggerWorkflowRequest(
        name=draw(st.sampled_from(("fuzz-flow", "fuzz-flow-2", "none")) | strings()),
        input=draw(st.sampled_from((b"", b"{}", b'{"items": [1, 2, 3]}', b"[", b"\xff")) | st.binary(max_size=64)),
    )
    return Probe("WorkflowService", "TriggerWorkflow", ("name", "input"), lambda memory: request)


@st.composite
def list_workflow_runs(draw: st.DrawFn) -> Probe:
    """By name, by the start of an id (of a run that exists, or fuzzed), or both, with any page."""
    name = draw(st.sampled_from(("fuzz-flow", "fuzz-flow-2", "")) | strings())
    page_size = draw(st.one_of(st.just(0), int32s()))
    token = draw(st.one_of(st.just(""), st.sampled_from(PAGE_TOKEN_EDGES), strings()))
    prefix = _pick(draw, st.one_of(strings(), st.sampled_from(("0", "0d43", "\U0010ffff", "-"))), fuzz_one_in=2)
    index = draw(st.integers(0, 10**6))

    def build(memory: Memory) -> Message:
        known = memory.workflow_runs[index % len(memory.workflow_runs)][:8] if memory.workflow_runs else ""
        return workflows_pb2.ListWorkflowRunsRequest(name=name, page_size=page_size, page_token=token,
                                                     id_prefix=known if prefix is KNOWN else prefix)  # type: ignore[arg-type]

    fields = ("name", "page_size", "page_token") + (() if prefix is KNOWN else ("id_prefix",))
    return Probe("WorkflowService", "ListWorkflowRuns", fields, build)


@st.composite
def workflow_run_ref(draw: st.DrawFn, method: str) -> Probe:
    run_id = _pick(draw, strings(), fuzz_one_in=3)
    index = draw(st.integers(0, 10**6))

    def build(memory: Memory) -> Message:
        known = memory.workflow_runs[index % len(memory.workflow_runs)] if memory.workflow_runs else "no-such-run"
        request_type = getattr(workflows_pb2, f"{method}Request")
        return request_type(workflow_run_id=known if run_id is KNOWN else run_id)  # type: ignore[no-any-return]

    return Probe("WorkflowService", method, () if run_id is KNOWN else ("workflow_run_id",), build)


# -- the worker stream -----------------------------------------------------------------------------

WORKER_JOB_TYPE = "fuzz-w"  # jobs of this type exist so misbehaving streams really get assignments

Build = Callable[[Memory, list[workers_pb2.Assignment]], workers_pb2.ConnectRequest]


@dataclass(frozen=True)
class Step:
    """One message a worker sends; ``build`` sees the assignments received so far."""

    kind: str
    build: Build
    fields: tuple[str, ...] = ()  # the fields carrying a fuzzed value
    pause: float = 0.0  # seconds to wait first (so assignments can arrive)


@dataclass(frozen=True)
class Session:
    """A worker stream from open to close."""

    steps: tuple[Step, ...]
    ending: str  # half_close | cancel | cancel_after_linger

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(step.kind for step in self.steps)

    @property
    def fields(self) -> tuple[str, ...]:
        """The fuzzed fields, in order; a stream that does not open with a hello says so first."""
        first = self.steps[0].kind if self.steps else "nothing"
        opening = () if first == "hello" else (f"opens with {first}",)
        second_hello = ("second hello",) if "hello" in self.kinds[1:] else ()
        fields = [field for step in self.steps for field in step.fields]
        return (*opening, *second_hello, *dict.fromkeys(fields))


class _Fields:
    """Draws each field valid, or (one time in ``one_in``) fuzzed, noting which were fuzzed."""

    def __init__(self, draw: st.DrawFn, one_in: int) -> None:
        self.draw, self.one_in, self.fuzzed = draw, one_in, []

    def __call__(self, name: str, valid: st.SearchStrategy[T], fuzzed: st.SearchStrategy[T]) -> T:
        if self.draw(st.integers(1, self.one_in)) == 1:
            self.fuzzed.append(name)
            return self.draw(fuzzed)
        return self.draw(valid)


def _job_types() -> st.SearchStrategy[list[str]]:
    return st.one_of(
        st.just([]),
        st.lists(strings(), min_size=1, max_size=5),
        st.sampled_from((
            [f"type-{i}" for i in range(1000)], [f"type-{i}" for i in range(1001)],
            [f"type-{i:0>40}" for i in range(5000)], [WORKER_JOB_TYPE] * 3000, ["x" * 65_536], ["x" * 201],
        )),
    )


@st.composite
def hellos(draw: st.DrawFn, one_in: int = 6) -> Step:
    field = _Fields(draw, one_in)
    hello = workers_pb2.Hello(
        worker_id=field("hello.worker_id", st.sampled_from(("fuzz-worker", "w-1", "é")),
                        st.one_of(st.sampled_from(("", "w\x00id", CONTROL, "x" * 10_000, "x" * 201)), strings())),
        job_types=field("hello.job_types", st.sampled_from((
            [WORKER_JOB_TYPE], ["fuzz", WORKER_JOB_TYPE], ["fuzz.other"],
            [LIVE_JOB_TYPE],  # steals the good worker's runs, then never reports them
        )), _job_types()),
        credits=field("hello.credits", st.sampled_from((0, 1, 10, 100)), int32s()),
        tenant=field("hello.tenant", st.sampled_from(("", "fuzz-w")), strings()),
    )
    return Step("hello", lambda memory, assigned: workers_pb2.ConnectRequest(hello=hello), tuple(field.fuzzed))


@st.composite
def credits(draw: st.DrawFn) -> Step:
    field = _Fields(draw, 3)
    grant = field("credit.credits", st.sampled_from((1, 5, 100)), int32s())
    message = workers_pb2.ConnectRequest(credit=workers_pb2.CreditGrant(credits=grant))
    return Step("credit", lambda memory, assigned: message, tuple(field.fuzzed))


RunTarget = Callable[[Memory, list[workers_pb2.Assignment]], tuple[str, int]]


@st.composite
def _run_target(draw: st.DrawFn, field: _Fields, owner: str) -> RunTarget:
    """A (run_id, lease_token) for a heartbeat or result: a run this stream was given (its token
    or a wrong one), another run of the daemon's, an id no run has, or a fuzzed id."""
    sources = ("assigned", "assigned", "assigned_wrong_token", "known", "unknown")
    source = field(f"{owner}.run_id", st.sampled_from(sources), st.just("fuzzed"))
    index, token, fuzzed_id = draw(st.integers(0, 10**6)), draw(int64s()), draw(strings())
    if source == "assigned_wrong_token":
        field.fuzzed.append(f"{owner}.lease_token")

    def pick(memory: Memory, assigned: list[workers_pb2.Assignment]) -> tuple[str, int]:
        owned = [a for a in assigned if a.job_type != LIVE_JOB_TYPE]  # never complete the good worker's runs
        if source.startswith("assigned") and owned:
            assignment = owned[index % len(owned)]
            return assignment.run_id, assignment.lease_token + (0 if source == "assigned" else 1 + token % 1000)
        known = memory.run(index)
        if source == "known" and known:
            return known[1], token & INT64_MAX
        if source == "fuzzed":
            return fuzzed_id, token
        return f"no-such-run-{index}", token & INT64_MAX

    return pick


@st.composite
def heartbeats(draw: st.DrawFn) -> Step:
    field = _Fields(draw, 8)
    beats = []
    for _ in range(draw(st.integers(0, 3))):
        target = draw(_run_target(field, "heartbeats.beats"))
        progress = field("heartbeats.beats.progress", st.one_of(st.none(), st.sampled_from((0.0, 0.5, 1.0))),
                         floats32())
        checkpoint = field("heartbeats.beats.checkpoint",
                           st.one_of(st.none(), st.sampled_from((b"", b"1", b"x" * MIB))), byte_strings())
        started_at = field("heartbeats.beats.started_at", st.one_of(st.none(), st.just(_now_plus(0))), timestamps())
        beats.append((target, draw(st.booleans()), progress, checkpoint, started_at))

    def build(memory: Memory, assigned: list[workers_pb2.Assignment]) -> workers_pb2.ConnectRequest:
        message = workers_pb2.ConnectRequest(heartbeats=workers_pb2.Heartbeats())
        for target, started, progress, checkpoint, started_at in beats:
            run_id, token = target(memory, assigned)
            beat = message.heartbeats.beats.add(run_id=run_id, lease_token=token, started=started)
            if started_at is not None:
                beat.started_at.CopyFrom(started_at)
            if progress is not None:
                beat.progress = progress
            if checkpoint is not None:
                beat.checkpoint = checkpoint
        return message

    return Step("heartbeats", build, tuple(field.fuzzed), pause=draw(st.sampled_from((0.0, 0.0, 0.03))))


@st.composite
def results(draw: st.DrawFn) -> Step:
    field = _Fields(draw, 8)
    reports = []
    for _ in range(draw(st.integers(0, 3))):
        reports.append((
            draw(_run_target(field, "results.results")),
            field("results.results.outcome", st.sampled_from(WORKER_OUTCOMES), enum_numbers(OUTCOMES)),
            field("results.results.error_code", st.sampled_from(("", "E1")), strings()),
            field("results.results.error_message", st.sampled_from(("", "boom")), strings()),
            field("results.results.started_at", st.one_of(st.none(), st.just(_now_plus(0))), timestamps()),
            field("results.results.finished_at", st.one_of(st.none(), st.just(_now_plus(0))), timestamps()),
            field("results.results.error_traceback", st.sampled_from(("", 'Traceback:\n  File "h.py"\nValueError')),
                  st.one_of(strings(), st.just("\x00\r" + "x" * 70_000))),
            # A workflow step's output: JSON up to 16 KiB is kept, anything else dropped, never refused.
            field("results.results.output", st.sampled_from((b"", b'{"ok": true}')),
                  st.one_of(st.binary(max_size=64), st.just(b'"' + b"x" * 70_000 + b'"'), st.just(b"\xff{"))),
        ))
    freed = field("results.credits", st.sampled_from((0, 0, 1, 5)), int32s())

    def build(memory: Memory, assigned: list[workers_pb2.Assignment]) -> workers_pb2.ConnectRequest:
        message = workers_pb2.ConnectRequest(results=workers_pb2.Results(credits=freed))
        for target, outcome, code, text, started_at, finished_at, traced, output in reports:
            run_id, token = target(memory, assigned)
            result = message.results.results.add(run_id=run_id, lease_token=token, outcome=outcome,
                                                 error_code=code, error_message=text, error_traceback=traced,
                                                 output=output)
            if started_at is not None:
                result.started_at.CopyFrom(started_at)
            if finished_at is not None:
                result.finished_at.CopyFrom(finished_at)
        return message

    return Step("results", build, tuple(field.fuzzed), pause=draw(st.sampled_from((0.0, 0.0, 0.03))))


UINT64_EDGES = (0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)
# The bounds a probe's estimate is held to (60 s of uncertainty, a day of offset either way), at and
# just past each edge, and the lead a node sends runs ahead within (20 ms by default).
UNCERTAINTY_EDGES = (Duration(), Duration(nanos=1_000), Duration(nanos=20_000_000), Duration(nanos=20_001_000),
                     Duration(seconds=60), Duration(seconds=60, nanos=1), Duration(seconds=60, nanos=1_000),
                     Duration(nanos=-1), Duration(seconds=-1))
OFFSET_EDGES = (Duration(), Duration(seconds=86_400), Duration(seconds=-86_400), Duration(seconds=86_400, nanos=1_000),
                Duration(seconds=-86_400, nanos=-1_000), Duration(seconds=3, nanos=-5), Duration(nanos=-250_000_000))


@st.composite
def clock_probes(draw: st.DrawFn) -> Step:
    """A clock probe: a valid one now and then (which makes the stream able to hold runs sent
    ahead), else random and boundary ids, send times, uncertainties and offsets."""
    field = _Fields(draw, 3)
    probe_id = field("clock_probe.probe_id", st.integers(0, 1000),
                     st.one_of(st.sampled_from(UINT64_EDGES), st.integers(0, 2**64 - 1)))
    sent_at = field("clock_probe.sent_at", st.one_of(st.none(), st.just(_now_plus(0))), timestamps())
    uncertainty = field("clock_probe.uncertainty",
                        st.one_of(st.none(), st.sampled_from((Duration(nanos=500_000), Duration(nanos=50_000_000)))),
                        st.one_of(st.sampled_from(UNCERTAINTY_EDGES), durations()))
    offset = field("clock_probe.offset", st.one_of(st.none(), st.just(Duration(nanos=-3_000_000))),
                   st.one_of(st.sampled_from(OFFSET_EDGES), durations()))
    message = workers_pb2.ConnectRequest(clock_probe=workers_pb2.ClockProbe(probe_id=probe_id))
    for name, value in (("sent_at", sent_at), ("uncertainty", uncertainty), ("offset", offset)):
        if value is not None:
            getattr(message.clock_probe, name).CopyFrom(value)
    return Step("clock_probe", lambda memory, assigned: message, tuple(field.fuzzed),
                pause=draw(st.sampled_from((0.0, 0.0, 0.03))))


def drains() -> st.SearchStrategy[Step]:
    """A Drain: the worker takes its credits back, at any point of its stream, more than once too."""
    return st.just(Step("drain", lambda memory, assigned: workers_pb2.ConnectRequest(drain=workers_pb2.Drain()), ()))


def empty_messages() -> st.SearchStrategy[Step]:
    return st.just(Step("empty", lambda memory, assigned: workers_pb2.ConnectRequest(), ("body (unset)",)))


def _followers() -> st.SearchStrategy[Step]:
    return st.one_of(credits(), heartbeats(), heartbeats(), results(), results(), results(), hellos(one_in=2),
                     clock_probes(), clock_probes(), drains(), empty_messages())


@st.composite
def sessions(draw: st.DrawFn) -> Session:
    """Mostly a hello then anything; sometimes anything before the hello, or nothing at all."""
    opening = draw(st.sampled_from(("hello",) * 8 + ("other", "nothing")))
    steps: list[Step] = []
    if opening == "hello":
        steps.append(draw(hellos()))
    elif opening == "other":
        steps.append(draw(st.one_of(credits(), heartbeats(), results(), clock_probes(), drains(), empty_messages())))
    if opening != "nothing":
        steps += draw(st.lists(_followers(), max_size=6))
    ending = draw(st.sampled_from(("half_close", "half_close", "cancel", "cancel_after_linger")))
    return Session(tuple(steps), ending)
