"""The web console's pure parts: lag quantiles and samples, sessions, the job form, the lag chart
and the in-process gateway to the servicers. No network, no processes, no sleeps."""

from __future__ import annotations

import dataclasses
import math
import re
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from fastlane._proto import common_pb2, jobs_pb2
from fastlane.auth.caller import ANONYMOUS, Caller, current_caller
from fastlane.console.activity import KEEP_SECONDS, Activity, Point, quantile
from fastlane.console.chart import lag_chart
from fastlane.console.forms import MAX_FIELD_CHARS, JobForm
from fastlane.console.gateway import CallRefused, Gateway
from fastlane.console.sessions import Sessions
from fastlane.domain.access import Role
from fastlane.domain.models import (
    Delivery,
    JobSpec,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Schedule,
)
from fastlane.errors import InvalidArgument
from fastlane.runtime.metrics import Metrics

INF = math.inf
T0 = datetime(2027, 3, 14, 7, 0, tzinfo=UTC)


# --- activity: quantile ---------------------------------------------------------------------------

# 2 observations up to 1 ms, 4 more up to 2 ms, 4 more up to 5 ms, none beyond.
HISTOGRAM = ((0.001, 2.0), (0.002, 6.0), (0.005, 10.0), (INF, 10.0))


def test_quantile_of_an_empty_histogram_is_none():
    assert quantile(0.5, []) is None
    assert quantile(0.5, [(0.001, 0.0), (0.002, 0.0), (INF, 0.0)]) is None
    assert quantile(0.99, [(INF, 0.0)]) is None


@pytest.mark.parametrize(("q", "expected"), [
    (0.1, 0.0005),  # rank 1 in the first bucket: interpolated from 0
    (0.2, 0.001),  # rank 2: exactly the first bucket's bound
    (0.25, 0.001125),  # rank 2.5: an eighth into (1 ms, 2 ms]
    (0.5, 0.00175),  # rank 5: three quarters into (1 ms, 2 ms]
    (0.9, 0.00425),  # rank 9: three quarters into (2 ms, 5 ms]
    (1.0, 0.005),
])
def test_quantile_interpolates_within_its_bucket_as_histogram_quantile_does(q, expected):
    assert quantile(q, HISTOGRAM) == pytest.approx(expected, rel=1e-12)


def test_quantile_beyond_the_last_finite_bound_is_that_bound():
    buckets = ((0.001, 1.0), (0.002, 2.0), (INF, 10.0))  # 8 of 10 beyond 2 ms
    assert quantile(0.5, buckets) == 0.002
    assert quantile(0.99, buckets) == 0.002
    assert quantile(0.15, buckets) == pytest.approx(0.0015)  # rank 1.5 is still within (1 ms, 2 ms]


# --- activity: samples and points -------------------------------------------------------------------

class Wall:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def count_outcomes(metrics: Metrics, **counts: int) -> None:
    # Split over two job types: the overview sums a node's runs of every job type and tenant.
    for outcome, count in counts.items():
        metrics.runs.labels(outcome=outcome, job_type="billing", tenant="acme").inc(count - count // 2)
        metrics.runs.labels(outcome=outcome, job_type="reports", tenant="globex").inc(count // 2)


def test_a_single_sample_makes_no_point():
    metrics = Metrics()
    activity = Activity(metrics, wall=Wall(1_000.0))
    assert activity.points() == []
    metrics.trigger_lag.observe(0.001)
    activity.sample()
    assert activity.points() == []


def test_each_point_is_the_difference_between_two_samples():
    metrics, wall = Metrics(), Wall(1_000.0)
    activity = Activity(metrics, wall=wall)
    metrics.trigger_lag.observe(5.0)  # before the first sample: in no point
    count_outcomes(metrics, succeeded=100, dead=50)
    activity.sample()

    for _ in range(40):
        metrics.trigger_lag.observe(0.0008)  # bucket (0.5 ms, 1 ms]
    for _ in range(60):
        metrics.trigger_lag.observe(0.0025)  # bucket (2 ms, 3 ms]
    count_outcomes(metrics, succeeded=20, dead=2, lost=1, cancelled=1, retry=3, skipped=5, released_from_buffer=4)
    wall.now = 1_010.0
    activity.sample()

    count_outcomes(metrics, succeeded=1)
    wall.now = 1_020.0
    activity.sample()

    first, second = activity.points()
    assert first.at == datetime.fromtimestamp(1_010.0, UTC)
    assert first.released == 100
    # rank 50 of 100: 10 of the 60 into (2 ms, 3 ms]; rank 99: 59 of the 60
    assert first.p50_ms == pytest.approx(2.0 + 10 / 60)
    assert first.p99_ms == pytest.approx(2.0 + 59 / 60)
    assert first.finished_per_second == pytest.approx(24 / 10)  # succeeded, dead, lost, cancelled
    assert first.failed == 6  # retry, dead, lost

    assert second.at == datetime.fromtimestamp(1_020.0, UTC)
    assert second.released == 0
    assert second.p50_ms is None
    assert second.p99_ms is None
    assert second.finished_per_second == pytest.approx(0.1)
    assert second.failed == 0


def test_points_beyond_the_kept_hour_are_dropped():
    metrics, wall = Metrics(), Wall(0.0)
    activity = Activity(metrics, wall=wall, sample_seconds=60.0)
    for minute in range(100):
        wall.now = minute * 60.0
        activity.sample()
    points = activity.points()
    assert len(points) == int(KEEP_SECONDS / 60)
    assert points[-1].at == datetime.fromtimestamp(99 * 60.0, UTC)
    assert points[0].at == datetime.fromtimestamp((99 - 59) * 60.0, UTC)


# --- sessions ----------------------------------------------------------------------------------------

class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_started_session_is_found_until_it_ends():
    clock = Monotonic()
    sessions = Sessions(monotonic=clock)
    session = sessions.start("fl_secret")
    assert session.token == "fl_secret"
    assert session.created_at == session.last_seen == 100.0
    assert len(sessions) == 1

    clock.now = 150.0
    assert sessions.find(session.session_id) is session
    assert session.last_seen == 150.0
    sessions.end(session.session_id)
    assert sessions.find(session.session_id) is None
    assert len(sessions) == 0
    sessions.end(session.session_id)  # ending twice is harmless


def test_unknown_and_missing_ids_find_nothing():
    sessions = Sessions(monotonic=Monotonic())
    sessions.start(None)
    assert sessions.find(None) is None
    assert sessions.find("") is None
    assert sessions.find("not-a-session") is None


def test_a_session_idle_too_long_is_over():
    clock = Monotonic()
    sessions = Sessions(monotonic=clock, idle_seconds=60.0, lifetime_seconds=10_000.0)
    session = sessions.start("t")
    clock.now += 60.0
    assert sessions.find(session.session_id) is session  # exactly the idle time: still live
    clock.now += 60.5
    assert sessions.find(session.session_id) is None
    assert len(sessions) == 0


def test_a_session_in_use_ends_after_its_lifetime():
    clock = Monotonic()
    sessions = Sessions(monotonic=clock, idle_seconds=60.0, lifetime_seconds=200.0)
    session = sessions.start("t")
    for _ in range(4):  # used every 50 s: never idle
        clock.now += 50.0
        assert sessions.find(session.session_id) is session
    clock.now += 1.0  # 201 s old
    assert sessions.find(session.session_id) is None
    assert len(sessions) == 0


def test_sessions_past_the_maximum_end_the_least_recently_used():
    clock = Monotonic()
    sessions = Sessions(monotonic=clock, max_sessions=3)
    a, b, c = (sessions.start(name) for name in "abc")
    clock.now += 1
    assert sessions.find(a.session_id) is a  # a is now the most recently used; b the least
    d = sessions.start("d")
    assert len(sessions) == 3
    assert sessions.find(b.session_id) is None
    assert [sessions.find(s.session_id) for s in (a, c, d)] == [a, c, d]
    sessions.start("e")  # a was used before c and d just now: a goes
    assert sessions.find(a.session_id) is None
    assert sessions.find(c.session_id) is c


def test_csrf_matches_only_the_sessions_own_token():
    sessions = Sessions(monotonic=Monotonic())
    session, other = sessions.start("t"), sessions.start("t")
    assert session.csrf_matches(session.csrf) is True
    assert session.csrf_matches(other.csrf) is False
    assert session.csrf_matches(session.csrf[:-1]) is False
    assert session.csrf_matches("") is False
    assert session.csrf_matches(None) is False


def test_session_ids_and_csrf_tokens_differ_between_sessions():
    sessions = Sessions(monotonic=Monotonic())
    started = [sessions.start("same-token") for _ in range(50)]
    ids = {s.session_id for s in started}
    csrfs = {s.csrf for s in started}
    assert len(ids) == 50
    assert len(csrfs) == 50
    assert not ids & csrfs
    assert all(len(s.session_id) >= 32 and len(s.csrf) >= 32 for s in started)


# --- forms -------------------------------------------------------------------------------------------

def form(**fields: str) -> JobForm:
    return JobForm.from_fields({"name": "nightly", "job_type": "report", **fields})


def field_of(error: pytest.ExceptionInfo[InvalidArgument]) -> str:
    return error.value.field


def test_a_cron_form_makes_a_cron_spec_in_its_zone():
    spec = form(schedule="cron", cron="0 3 * * *", timezone="Europe/Paris", payload='{"a": 1}',
                max_attempts="5", priority="7").spec(tenant="acme")
    assert spec == JobSpec(tenant="acme", name="nightly", job_type="report",
                           schedule=Schedule.cron_expr("0 3 * * *", "Europe/Paris"), payload=b'{"a": 1}',
                           priority=7, retry=RetryPolicy(max_attempts=5))


def test_a_cron_form_without_a_zone_reads_it_in_utc():
    spec = form(schedule="cron", cron="*/5 * * * *", timezone="").spec(tenant="acme")
    assert spec.schedule == Schedule.cron_expr("*/5 * * * *", "UTC")


@pytest.mark.parametrize(("text", "instant"), [
    ("2027-03-14T07:00:00Z", T0),
    ("2027-03-14T09:00:00+02:00", T0),
    (" 2027-03-14t07:00:00.25z ", T0 + timedelta(milliseconds=250)),
])
def test_an_at_form_makes_a_one_shot_at_its_instant(text, instant):
    spec = form(schedule="at", at=text).spec(tenant="acme")
    assert spec.schedule == Schedule.at_instant(instant)
    assert spec.schedule.at.utcoffset() == timedelta(0)


def test_an_interval_form_makes_an_interval_of_its_seconds():
    assert form(schedule="interval", every_seconds="90").spec(tenant="acme").schedule == \
        Schedule.interval(timedelta(seconds=90))
    assert form(schedule="interval", every_seconds="0.5").spec(tenant="acme").schedule == \
        Schedule.interval(timedelta(milliseconds=500))


def test_a_now_form_makes_a_now_schedule_whatever_else_is_filled():
    spec = form(schedule="now", cron="0 3 * * *", every_seconds="oops").spec(tenant="acme")
    assert spec.schedule == Schedule.now()
    assert spec.tenant == "acme"


def test_empty_priority_and_attempts_take_the_defaults():
    spec = form(schedule="now", priority="", max_attempts="").spec(tenant="acme")
    assert spec.priority == 0
    assert spec.retry.max_attempts == 3
    assert spec.payload == b""


def test_fields_are_read_trimmed():
    spec = form(schedule=" interval ", every_seconds=" 30 ", priority=" -5 ", max_attempts=" 9 ").spec(tenant="t")
    assert spec.schedule == Schedule.interval(timedelta(seconds=30))
    assert (spec.priority, spec.retry.max_attempts) == (-5, 9)


@pytest.mark.parametrize(("fields", "field"), [
    ({"schedule": "weekly"}, "schedule"),
    ({"schedule": ""}, "schedule"),
    ({"schedule": "now", "payload": "{not json"}, "payload"),
    ({"schedule": "now", "payload": "'single quotes'"}, "payload"),
    ({"schedule": "interval", "every_seconds": "ten"}, "every_seconds"),
    ({"schedule": "interval", "every_seconds": ""}, "every_seconds"),
    ({"schedule": "interval", "every_seconds": "0"}, "every_seconds"),
    ({"schedule": "interval", "every_seconds": "-30"}, "every_seconds"),
    ({"schedule": "interval", "every_seconds": "nan"}, "every_seconds"),
    ({"schedule": "interval", "every_seconds": "inf"}, "every_seconds"),
    ({"schedule": "now", "max_attempts": "3.5"}, "max_attempts"),
    ({"schedule": "now", "max_attempts": "three"}, "max_attempts"),
    ({"schedule": "now", "priority": "1e3"}, "priority"),
    ({"schedule": "now", "priority": "high"}, "priority"),
    ({"schedule": "now", "priority": str(1 << 40)}, "priority"),
    ({"schedule": "at", "at": "2027-03-14T07:00:00"}, "at"),  # no offset
    ({"schedule": "at", "at": "tomorrow"}, "at"),
])
def test_an_unreadable_field_is_named(fields, field):
    with pytest.raises(InvalidArgument) as error:
        form(**fields).spec(tenant="acme")
    assert field_of(error) == field


@pytest.mark.parametrize("name", ["name", "job_type", "cron", "timezone", "at", "every_seconds", "priority"])
def test_a_field_longer_than_the_limit_is_named(name):
    JobForm.from_fields({name: "1" * MAX_FIELD_CHARS})  # at the limit: read
    with pytest.raises(InvalidArgument) as error:
        JobForm.from_fields({name: "1" * (MAX_FIELD_CHARS + 1)})
    assert field_of(error) == name


def test_the_payload_may_be_longer_than_the_field_limit():
    payload = '{"data": "' + "x" * (MAX_FIELD_CHARS * 3) + '"}'
    assert form(schedule="now", payload=payload).spec(tenant="acme").payload == payload.encode()


BASE = JobSpec(
    tenant="acme", name="sync", job_type="sync.v1", schedule=Schedule.interval(timedelta(minutes=5), anchor=T0),
    payload=b'{"old": true}', priority=3, concurrency_key="db", concurrency_limit=2,
    retry=RetryPolicy(max_attempts=4, max_retry_time=timedelta(hours=1), backoff_base=timedelta(seconds=5)),
    misfire=MisfirePolicy(kind=MisfireKind.SKIP, grace=timedelta(seconds=3)),
    overlap=OverlapPolicy.SKIP, delivery=Delivery.AT_MOST_ONCE, timeout=timedelta(seconds=30),
    lease_ttl=timedelta(seconds=45),
)


def test_an_edit_keeps_the_base_specs_other_settings_and_its_interval_anchor():
    edited = form(schedule="interval", every_seconds="120", payload='{"new": 1}', max_attempts="6",
                  priority="9").spec(tenant="acme", based_on=BASE)
    assert edited == dataclasses.replace(
        BASE, name="nightly", job_type="report", schedule=Schedule.interval(timedelta(minutes=2), anchor=T0),
        payload=b'{"new": 1}', priority=9, retry=dataclasses.replace(BASE.retry, max_attempts=6),
    )
    assert edited.overlap is OverlapPolicy.SKIP
    assert edited.timeout == timedelta(seconds=30)
    assert edited.concurrency_key == "db"
    assert edited.retry.backoff_base == timedelta(seconds=5)


def test_an_edit_to_an_interval_from_another_kind_has_no_anchor():
    cron_base = dataclasses.replace(BASE, schedule=Schedule.cron_expr("0 * * * *"))
    edited = form(schedule="interval", every_seconds="60").spec(tenant="acme", based_on=cron_base)
    assert edited.schedule == Schedule.interval(timedelta(minutes=1))
    assert edited.overlap is OverlapPolicy.SKIP


def test_an_edit_to_another_kind_replaces_the_schedule():
    edited = form(schedule="cron", cron="0 4 * * 1", timezone="Asia/Tokyo").spec(tenant="acme", based_on=BASE)
    assert edited.schedule == Schedule.cron_expr("0 4 * * 1", "Asia/Tokyo")
    assert edited.misfire == BASE.misfire


@pytest.mark.parametrize("schedule", [
    Schedule.cron_expr("30 2 * * *", "America/New_York"),
    Schedule.at_instant(T0 + timedelta(microseconds=123456)),
    Schedule.interval(timedelta(seconds=90), anchor=T0),
    Schedule.interval(timedelta(milliseconds=2500)),
    Schedule.now(),
])
def test_a_form_from_a_spec_gives_the_spec_back(schedule):
    spec = dataclasses.replace(BASE, schedule=schedule)
    shown = JobForm.from_spec(spec)
    assert shown.schedule == schedule.kind.value
    assert shown.spec(tenant="acme", based_on=spec) == spec
    # and through the browser: the fields as text, read again
    fields = {f.name: getattr(shown, f.name) for f in dataclasses.fields(JobForm)}
    assert JobForm.from_fields(fields).spec(tenant="acme", based_on=spec) == spec


def test_a_form_from_a_new_spec_gives_the_spec_back_without_a_base():
    spec = JobSpec(tenant="acme", name="n", job_type="t", schedule=Schedule.cron_expr("0 3 * * *", "Europe/Paris"),
                   payload=b"[1, 2]", priority=-2, retry=RetryPolicy(max_attempts=1))
    shown = JobForm.from_spec(spec)
    assert shown == JobForm(name="n", job_type="t", schedule="cron", cron="0 3 * * *", timezone="Europe/Paris",
                            max_attempts="1", priority="-2")  # the payload is never shown
    assert shown.spec(tenant="acme") == dataclasses.replace(spec, payload=b"")


def test_an_interval_with_seven_significant_digits_survives_an_edit():
    spec = dataclasses.replace(BASE, schedule=Schedule.interval(timedelta(seconds=1_234_567), anchor=T0))
    assert JobForm.from_spec(spec).spec(tenant="acme", based_on=spec) == spec


# --- chart -------------------------------------------------------------------------------------------

POLYLINE = re.compile(r'<polyline class="(p50|p99)" points="([^"]*)"/>')
NOW = datetime(2027, 3, 14, 12, 0, tzinfo=UTC)


def point(minutes_ago: float, p50: float | None, p99: float | None, released: int = 10) -> Point:
    return Point(at=NOW - timedelta(minutes=minutes_ago), released=released if p50 is not None else 0,
                 finished_per_second=1.0, failed=0, p50_ms=p50, p99_ms=p99)


def polylines(svg: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"p50": [], "p99": []}
    for name, points in POLYLINE.findall(svg):
        found[name].append(points)
    return found


def test_the_chart_draws_a_p50_and_a_p99_line_through_the_points():
    svg = str(lag_chart([point(30, 2.0, 8.0), point(0, 1.0, 4.0)], NOW))
    assert svg.startswith("<svg ") and svg.endswith("</svg>")
    # x: 48 + 664 * (1 - age / 1 h); y: 10 + 168 * (1 - ms / 10), the axis topped at 10 ms
    assert polylines(svg) == {"p50": ["380.0,144.4 712.0,161.2"], "p99": ["380.0,43.6 712.0,110.8"]}
    assert ">10 ms</text>" in svg and ">5 ms</text>" in svg and ">0 ms</text>" in svg
    assert "no run released" not in svg


def test_the_chart_breaks_its_lines_where_nothing_was_released():
    svg = str(lag_chart([point(20, 1.0, 2.0), point(10, None, None), point(0, 1.0, 2.0)], NOW))
    lines = polylines(svg)
    assert len(lines["p50"]) == 2
    assert len(lines["p99"]) == 2
    assert all(len(line.split(" ")) == 1 for line in lines["p50"] + lines["p99"])
    assert "no run released" not in svg


def test_the_chart_says_so_when_nothing_was_released():
    svg = str(lag_chart([point(20, None, None), point(10, None, None)], NOW))
    assert polylines(svg) == {"p50": [], "p99": []}
    assert "no run released on its time in the last hour" in svg
    assert ">1 ms</text>" in svg  # a default axis
    empty = str(lag_chart([], NOW))
    assert "no run released on its time in the last hour" in empty
    assert "<polyline" not in empty


def test_the_chart_leaves_out_points_older_than_an_hour():
    svg = str(lag_chart([point(90, 3.0, 3.0), point(5, 1.0, 1.0)], NOW))
    assert len(polylines(svg)["p50"]) == 1
    assert len(polylines(svg)["p50"][0].split(" ")) == 1
    assert "no run released" not in svg
    old_only = str(lag_chart([point(90, 3.0, 3.0)], NOW))
    assert "no run released on its time in the last hour" in old_only


def test_the_chart_is_markup_without_script():
    svg = lag_chart([point(30, 0.7, 900.0), point(0, None, None)], NOW)
    assert hasattr(svg, "__html__")
    text = str(svg).lower()
    assert "<script" not in text
    assert "javascript:" not in text
    assert not re.search(r"\son\w+\s*=", text)  # no event attributes
    assert ">1000 ms</text>" in str(svg)


# --- gateway -----------------------------------------------------------------------------------------

CLIENT = Caller(token_id="tok-client", name="deploy bot", tenant="acme", role=Role.CLIENT)
VIEWER = Caller(token_id="tok-viewer", name="dashboard", tenant="acme", role=Role.VIEWER)
WORKER = Caller(token_id="tok-worker", name="vm-1", tenant="acme", role=Role.WORKER)


class FakeJobService:
    def __init__(self) -> None:
        self.seen: list[tuple[object, Caller]] = []

    async def PauseJob(self, request, context):
        self.seen.append((request, current_caller.get()))
        return jobs_pb2.PauseJobResponse(job=common_pb2.Job(job_id=request.job_id, version=2))

    async def GetJob(self, request, context):
        self.seen.append((request, current_caller.get()))
        await context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.job_id} not found")
        raise AssertionError("unreachable")

    async def DeleteJob(self, request, context):
        self.seen.append((request, current_caller.get()))
        return jobs_pb2.GetJobRequest(job_id=request.job_id)  # not what the caller expects


@pytest.fixture
def jobs() -> FakeJobService:
    return FakeJobService()


@pytest.fixture
def gateway(jobs: FakeJobService) -> Gateway:
    return Gateway({"JobService": jobs})


async def test_a_call_runs_as_the_caller_and_answers_the_servicers_response(gateway, jobs):
    request = jobs_pb2.PauseJobRequest(tenant="acme", job_id="job-1")
    response = await gateway.call(CLIENT, "JobService/PauseJob", request, jobs_pb2.PauseJobResponse)
    assert response == jobs_pb2.PauseJobResponse(job=common_pb2.Job(job_id="job-1", version=2))
    assert jobs.seen == [(request, CLIENT)]
    assert current_caller.get() is ANONYMOUS


async def test_the_caller_before_the_call_is_restored_after_it(gateway, jobs):
    outer = Caller(token_id="tok-outer", name="outer", tenant="other", role=Role.ADMIN)
    token = current_caller.set(outer)
    try:
        await gateway.call(CLIENT, "JobService/PauseJob", jobs_pb2.PauseJobRequest(job_id="j"), jobs_pb2.PauseJobResponse)
        assert jobs.seen[0][1] is CLIENT
        assert current_caller.get() is outer
    finally:
        current_caller.reset(token)


@pytest.mark.parametrize(("caller", "method"), [
    (VIEWER, "JobService/PauseJob"),
    (WORKER, "JobService/GetJob"),
    (CLIENT, "AdminService/CreateToken"),
    (dataclasses.replace(CLIENT, role=Role.ADMIN), "JobService/NoSuchMethod"),
])
async def test_a_call_the_role_may_not_make_is_refused_before_the_servicer(gateway, jobs, caller, method):
    with pytest.raises(CallRefused) as refused:
        await gateway.call(caller, method, jobs_pb2.PauseJobRequest(job_id="j"), jobs_pb2.PauseJobResponse)
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.message == f"a {caller.role} token may not call {method.rsplit('/', 1)[-1]}"
    assert jobs.seen == []
    assert not gateway.may(caller, method)


def test_may_follows_the_role_table(gateway):
    assert gateway.may(CLIENT, "JobService/PauseJob")
    assert gateway.may(VIEWER, "JobService/GetJob")
    assert not gateway.may(VIEWER, "JobService/PauseJob")
    assert Gateway.method_name("JobService/PauseJob") == "/fastlane.v1.JobService/PauseJob"


async def test_an_abort_of_the_servicer_becomes_a_refusal_with_its_status(gateway, jobs):
    with pytest.raises(CallRefused) as refused:
        await gateway.call(VIEWER, "JobService/GetJob", jobs_pb2.GetJobRequest(job_id="job-9"), jobs_pb2.GetJobResponse)
    assert refused.value.code is grpc.StatusCode.NOT_FOUND
    assert refused.value.message == "job job-9 not found"
    assert str(refused.value) == "job job-9 not found"
    assert jobs.seen[0][1] is VIEWER
    assert current_caller.get() is ANONYMOUS


async def test_a_response_of_the_wrong_type_is_a_type_error(gateway, jobs):
    with pytest.raises(TypeError, match="JobService/DeleteJob answered GetJobRequest, not DeleteJobResponse"):
        await gateway.call(CLIENT, "JobService/DeleteJob", jobs_pb2.DeleteJobRequest(job_id="j"),
                           jobs_pb2.DeleteJobResponse)
    assert len(jobs.seen) == 1
    assert current_caller.get() is ANONYMOUS
