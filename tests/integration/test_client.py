"""The client SDK against a fake daemon: an in-process grpc.aio server keeping jobs in a dict.

The fake converts with :mod:`fastlane.rpc.wire` and maps errors with :mod:`fastlane.rpc.status`, as
the real servicers do, so these tests check the client's side of the wire: requests carry what
was asked, responses come back as the same domain values, and status codes become the right
exceptions.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import orjson
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fastlane._proto import (
    admin_pb2,
    admin_pb2_grpc,
    jobs_pb2,
    jobs_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
)
from fastlane.cli.main import main
from fastlane.cli.runs import RUN_COLUMNS
from fastlane.client import Client
from fastlane.domain.errors import JobAlreadyExists, JobNotFound, RunNotFound
from fastlane.domain.models import (
    Attempt,
    AttemptOutcome,
    Delivery,
    Job,
    JobSpec,
    JobState,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Run,
    RunState,
    Schedule,
    new_id,
)
from fastlane.domain.schedules import first_fire, local_time, preview
from fastlane.errors import FastlaneError, RemoteAlreadyExists, RemoteNotFound, RemoteUnavailable
from fastlane.rpc import wire
from fastlane.rpc.enums import JOB_STATE, RUN_STATE
from fastlane.rpc.status import status_of

TENANT = "acme"
T0 = datetime(2027, 3, 13, 12, 0, tzinfo=UTC)


# -- the fake daemon ---------------------------------------------------------------------------


@dataclass
class FakeState:
    """What the fake daemon holds, and what it was asked (for assertions)."""

    jobs: dict[str, Job] = field(default_factory=dict)
    runs: dict[str, tuple[Run, list[Attempt]]] = field(default_factory=dict)
    list_jobs_requests: list[jobs_pb2.ListJobsRequest] = field(default_factory=list)
    list_runs_calls: int = 0
    list_runs_requests: list[runs_pb2.ListRunsRequest] = field(default_factory=list)
    tenants_seen: set[str] = field(default_factory=set)

    def job(self, tenant: str, job_id: str) -> Job:
        self.tenants_seen.add(tenant)
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant:
            raise JobNotFound(job_id)
        return job

    def add_run(self, run: Run, attempts: list[Attempt]) -> None:
        self.runs[run.run_id] = (run, attempts)


def page_of(items: list, page_size: int, page_token: str) -> tuple[list, str]:
    start = int(page_token or 0)
    end = start + (page_size or 100)
    return items[start:end], (str(end) if end < len(items) else "")


async def refuse(context: grpc.aio.ServicerContext, error: FastlaneError) -> None:
    await context.abort(status_of(error), str(error))


class FakeJobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, state: FakeState) -> None:
        self.state = state

    async def CreateJob(self, request, context):
        spec = wire.spec_from_pb(request.spec)
        self.state.tenants_seen.add(spec.tenant)
        for job in self.state.jobs.values():
            if job.tenant == spec.tenant and job.name == spec.name:
                if job.spec != spec:
                    await refuse(context, JobAlreadyExists(spec.tenant, spec.name, "spec"))
                return jobs_pb2.CreateJobResponse(job=wire.job_to_pb(job), created=False)
        job = Job(
            job_id=new_id(),
            shard_id=3,
            spec=spec,
            state=JobState.ACTIVE,
            next_fire_at=first_fire(spec.schedule, T0),
            created_at=T0,
            updated_at=T0,
        )
        self.state.jobs[job.job_id] = job
        return jobs_pb2.CreateJobResponse(job=wire.job_to_pb(job), created=True)

    async def GetJob(self, request, context):
        try:
            return jobs_pb2.GetJobResponse(job=wire.job_to_pb(self.state.job(request.tenant, request.job_id)))
        except JobNotFound as error:
            await refuse(context, error)

    async def ListJobs(self, request, context):
        self.state.list_jobs_requests.append(request)
        matching = [
            job
            for job in self.state.jobs.values()
            if job.tenant == request.tenant
            and (not request.state or JOB_STATE.number(job.state) == request.state)
            and (not request.job_type or job.job_type == request.job_type)
            and (not request.name or job.name == request.name)
            and (not request.id_prefix or job.job_id.startswith(request.id_prefix))
        ]
        jobs, next_token = page_of(matching, request.page_size, request.page_token)
        return jobs_pb2.ListJobsResponse(jobs=[wire.job_to_pb(job) for job in jobs], next_page_token=next_token)

    async def UpdateJob(self, request, context):
        spec = wire.spec_from_pb(request.spec)
        try:
            job = self.state.job(spec.tenant, request.job_id)
        except JobNotFound as error:
            await refuse(context, error)
        job = replace(job, spec=spec, version=job.version + 1)
        self.state.jobs[job.job_id] = job
        return jobs_pb2.UpdateJobResponse(job=wire.job_to_pb(job))

    async def _set_state(self, request, context, state: JobState) -> Job:
        try:
            job = self.state.job(request.tenant, request.job_id)
        except JobNotFound as error:
            await refuse(context, error)
        job = replace(job, state=state)
        self.state.jobs[job.job_id] = job
        return job

    async def PauseJob(self, request, context):
        return jobs_pb2.PauseJobResponse(job=wire.job_to_pb(await self._set_state(request, context, JobState.PAUSED)))

    async def ResumeJob(self, request, context):
        return jobs_pb2.ResumeJobResponse(job=wire.job_to_pb(await self._set_state(request, context, JobState.ACTIVE)))

    async def DeleteJob(self, request, context):
        try:
            self.state.job(request.tenant, request.job_id)
        except JobNotFound as error:
            await refuse(context, error)
        del self.state.jobs[request.job_id]
        return jobs_pb2.DeleteJobResponse()

    async def TriggerJob(self, request, context):
        try:
            job = self.state.job(request.tenant, request.job_id)
        except JobNotFound as error:
            await refuse(context, error)
        run = Run(
            run_id=new_id(),
            job_id=job.job_id,
            tenant=job.tenant,
            job_type=job.job_type,
            shard_id=job.shard_id,
            scheduled_for=T0,
            available_at=T0,
            state=RunState.SCHEDULED,
            attempts=0,
            payload=job.spec.payload,
            priority=job.spec.priority,
            manual=True,
            delivery=job.spec.delivery,
            lease_ttl=job.spec.lease_ttl,
            created_at=T0,
            updated_at=T0,
        )
        self.state.add_run(run, [])
        return jobs_pb2.TriggerJobResponse(run=wire.run_to_pb(run))

    async def PreviewSchedule(self, request, context):
        schedule = wire.schedule_from_pb(request.schedule)
        after = wire.instant(request.after, request.HasField("after")) or datetime.now(UTC)
        zone_name = schedule.timezone
        return jobs_pb2.PreviewScheduleResponse(
            fire_times=[
                jobs_pb2.FireTime(utc=wire.timestamp(utc), local=local_time(utc, zone_name).isoformat())
                for utc in preview(schedule, after, request.count or 5)
            ]
        )


class FakeRunService(runs_pb2_grpc.RunServiceServicer):
    def __init__(self, state: FakeState) -> None:
        self.state = state

    async def ListRuns(self, request, context):
        self.state.list_runs_calls += 1
        self.state.list_runs_requests.append(request)
        matching = [
            run
            for run, _ in self.state.runs.values()
            if run.tenant == request.tenant
            and (not request.job_id or run.job_id == request.job_id)
            and (not request.states or RUN_STATE.number(run.state) in request.states)
            and (not request.id_prefix or run.run_id.startswith(request.id_prefix))
        ]
        matching.sort(key=lambda run: run.scheduled_for, reverse=True)
        runs, next_token = page_of(matching, request.page_size, request.page_token)
        return runs_pb2.ListRunsResponse(runs=[wire.run_to_pb(run) for run in runs], next_page_token=next_token)

    async def GetRun(self, request, context):
        found = self.state.runs.get(request.run_id)
        if found is None or found[0].tenant != request.tenant:
            await refuse(context, RunNotFound(request.run_id))
        run, attempts = found
        return runs_pb2.GetRunResponse(run=wire.run_to_pb(run), attempts=[wire.attempt_to_pb(a) for a in attempts])


class FakeAdminService(admin_pb2_grpc.AdminServiceServicer):
    async def GetCluster(self, request, context):
        return admin_pb2.GetClusterResponse(
            database_time=wire.timestamp(T0),
            nodes=[admin_pb2.NodeStatus(node_id="node-a", address="127.0.0.1:7070", shards_owned=2, ready=True,
                                        heap_size=5, ready_runs=0),
                   # Another node, as the one that answers knows it: its heartbeat row, not its own state.
                   admin_pb2.NodeStatus(node_id="node-b", address="127.0.0.1:7071", shards_owned=0, live=True)],
            shards=[
                admin_pb2.ShardStatus(shard_id=0, owner="node-a", token=4, lease_expires_at=wire.timestamp(T0)),
                admin_pb2.ShardStatus(shard_id=1, owner="", token=0),
            ],
            workers=[admin_pb2.WorkerStatus(worker_id="w1", job_types=["report.build", "t"], credits=4, in_flight=1,
                                            node_id="node-a")],
        )


@dataclass
class FakeDaemon:
    address: str
    state: FakeState
    health: health.aio.HealthServicer


@pytest.fixture
async def daemon() -> AsyncIterator[FakeDaemon]:
    state = FakeState()
    server = grpc.aio.server()
    health_servicer = health.aio.HealthServicer()
    jobs_pb2_grpc.add_JobServiceServicer_to_server(FakeJobService(state), server)
    runs_pb2_grpc.add_RunServiceServicer_to_server(FakeRunService(state), server)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(FakeAdminService(), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield FakeDaemon(address=f"127.0.0.1:{port}", state=state, health=health_servicer)
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def client(daemon: FakeDaemon) -> AsyncIterator[Client]:
    async with Client(daemon.address, tenant=TENANT, timeout=5.0) as client:
        yield client


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def full_spec(name: str, schedule: Schedule) -> JobSpec:
    """A spec with every policy away from its default, so a field lost on the wire shows."""
    return JobSpec(
        tenant=TENANT,
        name=name,
        job_type="report.build",
        schedule=schedule,
        payload=b'{"report": 7}',
        priority=-12,
        concurrency_key="reports",
        concurrency_limit=4,
        retry=RetryPolicy(
            max_attempts=7,
            max_retry_time=timedelta(hours=1),
            backoff_base=timedelta(milliseconds=250),
            backoff_cap=timedelta(seconds=40),
        ),
        misfire=MisfirePolicy(kind=MisfireKind.FIRE_ALL, grace=timedelta(seconds=3), fire_all_cap=9),
        overlap=OverlapPolicy.BUFFER_ONE,
        delivery=Delivery.AT_MOST_ONCE,
        timeout=timedelta(minutes=5),
        lease_ttl=timedelta(seconds=12),
    )


# -- jobs --------------------------------------------------------------------------------------

SCHEDULES = {
    "cron": Schedule.cron_expr("30 2 * * *", "America/New_York"),
    "cron-utc": Schedule.cron_expr("*/5 * * * *"),
    "interval": Schedule.interval(timedelta(seconds=90), T0 + timedelta(seconds=1)),
    "interval-unanchored": Schedule.interval(timedelta(milliseconds=1500)),
    "at": Schedule.at_instant(datetime(2027, 3, 14, 7, 0, 0, 123456, tzinfo=UTC)),
    "now": Schedule.now(),
}


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
async def test_created_job_reads_back_with_the_same_schedule_and_policies(client: Client, kind: str) -> None:
    spec = full_spec(f"job-{kind}", SCHEDULES[kind])

    created, was_created = await client.create_job(spec)
    fetched = await client.get_job(created.job_id)

    assert was_created
    assert created.spec == spec
    assert fetched == created
    assert fetched.state is JobState.ACTIVE
    assert fetched.shard_id == 3


async def test_create_is_idempotent_on_tenant_and_name(client: Client) -> None:
    spec = full_spec("nightly", SCHEDULES["cron"])

    first, first_created = await client.create_job(spec)
    again, again_created = await client.create_job(spec)

    assert (first_created, again_created) == (True, False)
    assert again.job_id == first.job_id
    with pytest.raises(RemoteAlreadyExists, match="nightly"):
        await client.create_job(replace(spec, priority=5))


async def test_create_encodes_the_payload_as_json_and_takes_policies_by_keyword(client: Client) -> None:
    job = await client.create(
        "welcome-mail",
        "email.send",
        Schedule.now(),
        payload={"to": "a@example.com", "n": [1, 2]},
        priority=9,
        retry=RetryPolicy(max_attempts=2),
    )

    assert orjson.loads(job.spec.payload) == {"to": "a@example.com", "n": [1, 2]}
    assert job.spec.priority == 9
    assert job.spec.retry.max_attempts == 2
    assert job.tenant == TENANT
    raw = await client.create("raw", "blob.store", Schedule.now(), payload=b"\x00\xff")
    assert raw.spec.payload == b"\x00\xff"
    with pytest.raises(TypeError, match="colour"):
        await client.create("bad", "x", Schedule.now(), colour="red")


async def test_every_request_speaks_for_the_clients_tenant(client: Client, daemon: FakeDaemon) -> None:
    # A spec built with the default tenant joins the client's.
    job, _ = await client.create_job(replace(full_spec("t", SCHEDULES["now"]), tenant="default"))

    await client.get_job(job.job_id)
    await client.list_jobs()

    assert job.tenant == TENANT
    assert daemon.state.tenants_seen == {TENANT}
    assert daemon.state.list_jobs_requests[-1].tenant == TENANT


async def test_missing_objects_raise_remote_not_found(client: Client) -> None:
    for call in (client.get_job, client.pause_job, client.resume_job, client.delete_job, client.trigger_job):
        with pytest.raises(RemoteNotFound, match="no-such-job"):
            await call("no-such-job")
    with pytest.raises(RemoteNotFound, match="no-such-run"):
        await client.get_run("no-such-run")


async def test_a_job_of_another_tenant_is_not_found(client: Client, daemon: FakeDaemon) -> None:
    job, _ = await client.create_job(full_spec("private", SCHEDULES["now"]))

    async with Client(daemon.address, tenant="other", timeout=5.0) as stranger:
        with pytest.raises(RemoteNotFound):
            await stranger.get_job(job.job_id)


async def test_iter_jobs_collects_every_page(client: Client, daemon: FakeDaemon) -> None:
    names = {f"job-{number:02d}" for number in range(25)}
    for name in sorted(names):
        await client.create(name, "report.build", SCHEDULES["cron"])

    collected = [job.name async for job in client.iter_jobs(page_size=10)]

    assert sorted(collected) == sorted(names)
    requests = daemon.state.list_jobs_requests
    assert [request.page_token for request in requests] == ["", "10", "20"]
    assert {request.page_size for request in requests} == {10}


async def test_list_jobs_filters_and_returns_the_next_page_token(client: Client) -> None:
    paused_ids = set()
    for number in range(4):
        job = await client.create(f"job-{number}", "a" if number % 2 else "b", SCHEDULES["cron"])
        if number < 2:
            paused_ids.add((await client.pause_job(job.job_id)).job_id)

    paused = await client.list_jobs(state=JobState.PAUSED)
    of_type_a = await client.list_jobs(job_type="a", page_size=1)

    assert {job.job_id for job in paused.items} == paused_ids
    assert paused.next_page_token == ""
    assert [job.job_type for job in of_type_a.items] == ["a"]
    assert of_type_a.next_page_token == "1"


async def test_pause_resume_update_and_delete(client: Client) -> None:
    job = await client.create("lifecycle", "report.build", SCHEDULES["cron"])

    assert (await client.pause_job(job.job_id)).state is JobState.PAUSED
    assert (await client.resume_job(job.job_id)).state is JobState.ACTIVE
    changed = replace(job.spec, schedule=SCHEDULES["interval"], priority=100)
    updated = await client.update_job(job.job_id, changed)
    assert updated.spec == changed
    assert updated.version == job.version + 1
    await client.delete_job(job.job_id)
    with pytest.raises(RemoteNotFound):
        await client.get_job(job.job_id)


# -- runs --------------------------------------------------------------------------------------


def finished_run(job_id: str, minutes: int, state: RunState) -> tuple[Run, list[Attempt]]:
    scheduled = T0 + timedelta(minutes=minutes)
    run = Run(
        run_id=new_id(),
        job_id=job_id,
        tenant=TENANT,
        job_type="report.build",
        shard_id=3,
        scheduled_for=scheduled,
        available_at=scheduled,
        state=state,
        attempts=2,
        payload=b"",
        priority=0,
        manual=False,
        delivery=Delivery.AT_LEAST_ONCE,
        lease_ttl=timedelta(seconds=30),
        created_at=scheduled,
        updated_at=scheduled,
        worker_id="worker-1",
        first_attempt_at=scheduled + timedelta(milliseconds=1500),
        first_started_at=scheduled + timedelta(milliseconds=1520),
        finished_at=scheduled + timedelta(seconds=4),
        last_error="boom" if state is RunState.DEAD else None,
    )
    attempts = [
        Attempt(
            run_id=run.run_id,
            attempt=number,
            lease_token=0,  # not on the wire
            worker_id="worker-1",
            node_id="node-a",
            outcome=outcome,
            dispatched_at=scheduled + timedelta(seconds=number),
            started_at=scheduled + timedelta(seconds=number, milliseconds=5),
            finished_at=scheduled + timedelta(seconds=number + 1),
            error_code="E_BOOM" if outcome is AttemptOutcome.FAILED else None,
            error_message="boom" if outcome is AttemptOutcome.FAILED else None,
            reported_late=number == 2,  # the flags cross the wire too
            redelivery=number == 1,
        )
        for number, outcome in ((1, AttemptOutcome.FAILED), (2, AttemptOutcome.SUCCEEDED))
    ]
    return run, attempts


async def test_get_run_returns_the_run_and_its_attempts(client: Client, daemon: FakeDaemon) -> None:
    run, attempts = finished_run("job-1", 0, RunState.SUCCEEDED)
    daemon.state.add_run(run, attempts)

    fetched, fetched_attempts = await client.get_run(run.run_id)

    assert fetched_attempts == attempts
    assert (fetched.run_id, fetched.job_id, fetched.state, fetched.attempts) == (
        run.run_id,
        "job-1",
        RunState.SUCCEEDED,
        2,
    )
    assert (fetched.scheduled_for, fetched.finished_at, fetched.worker_id) == (
        run.scheduled_for,
        run.finished_at,
        "worker-1",
    )
    assert fetched.idempotency_key == run.idempotency_key


async def test_list_runs_filters_by_job_and_state(client: Client, daemon: FakeDaemon) -> None:
    for minutes, job_id, state in ((0, "j1", RunState.SUCCEEDED), (1, "j1", RunState.DEAD), (2, "j2", RunState.DEAD)):
        daemon.state.add_run(*finished_run(job_id, minutes, state))

    dead = await client.list_runs(states=[RunState.DEAD])
    of_j1 = await client.list_runs(job_id="j1", page_size=1)

    assert [(run.job_id, run.state) for run in dead.items] == [("j2", RunState.DEAD), ("j1", RunState.DEAD)]
    assert [run.state for run in of_j1.items] == [RunState.DEAD]
    assert of_j1.next_page_token


async def test_trigger_returns_a_manual_run(client: Client) -> None:
    job = await client.create("on-demand", "report.build", SCHEDULES["cron"])

    run = await client.trigger_job(job.job_id)
    fetched, attempts = await client.get_run(run.run_id)

    assert run.manual and run.job_id == job.job_id and run.state is RunState.SCHEDULED
    assert fetched.run_id == run.run_id and attempts == []


# -- preview, cluster, readiness ---------------------------------------------------------------


async def test_preview_returns_utc_and_local_times(client: Client) -> None:
    fires = await client.preview(SCHEDULES["cron"], after=T0, count=2)

    assert fires == [
        (datetime(2027, 3, 14, 7, 0, tzinfo=UTC), datetime(2027, 3, 14, 7, 0, tzinfo=UTC)),
        (datetime(2027, 3, 15, 6, 30, tzinfo=UTC), datetime(2027, 3, 15, 6, 30, tzinfo=UTC)),
    ]
    assert [local.utcoffset() for _, local in fires] == [timedelta(hours=-4)] * 2


async def test_cluster_and_wait_ready(client: Client, daemon: FakeDaemon) -> None:
    await daemon.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    with pytest.raises(TimeoutError):
        await client.wait_ready(0.3)
    await daemon.health.set("", health_pb2.HealthCheckResponse.SERVING)
    await asyncio.wait_for(client.wait_ready(5.0), 10)

    status = await client.cluster()

    assert [node.node_id for node in status.nodes] == ["node-a", "node-b"]
    assert [(node.ready, node.heap_size) for node in status.nodes] == [(True, 5), (None, None)]  # b's: not known
    assert [shard.owner for shard in status.shards] == ["node-a", ""]


async def test_an_unreachable_daemon_raises_remote_unavailable() -> None:
    async with Client(f"127.0.0.1:{closed_port()}", timeout=5.0) as client:
        with pytest.raises(RemoteUnavailable):
            await client.get_job("anything")


# -- the CLI against the fake daemon -----------------------------------------------------------


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    # main() runs its own event loop, so it runs in a thread while this loop serves the fake.
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_cli_create_then_list_runs_as_json(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)

    code, out, err = await run_cli(
        capsys,
        "jobs", "create", "--name", "nightly", "--type", "report.build", "--cron", "30 2 * * *",
        "--tz", "America/New_York", "--payload", '{"id": 7}', "--priority", "5", "--max-attempts", "4",
        "--misfire", "skip", "--overlap", "skip", "--timeout", "60", "--lease-ttl", "15", "--json", *remote,
    )  # fmt: skip
    created = orjson.loads(out)
    assert (code, err) == (0, "")
    assert created["created"] is True
    assert created["schedule"] == {"kind": "cron", "cron": "30 2 * * *", "timezone": "America/New_York"}
    assert created["payload"] == {"id": 7}
    assert (created["priority"], created["retry"]["max_attempts"], created["misfire"]["kind"]) == (5, 4, "skip")
    assert (created["timeout_seconds"], created["lease_ttl_seconds"], created["tenant"]) == (60.0, 15.0, TENANT)
    assert created["next_fire_at"] == "2027-03-14T07:00:00Z"

    code, out, _ = await run_cli(capsys, "jobs", "trigger", created["job_id"], "--json", *remote)
    triggered = orjson.loads(out)
    run, attempts = finished_run(created["job_id"], 5, RunState.DEAD)
    daemon.state.add_run(run, attempts)

    code, out, _ = await run_cli(
        capsys, "runs", "list", "--job", created["job_id"], "--state", "dead", "--json", *remote
    )
    [listed] = orjson.loads(out)
    assert code == 0
    assert listed == {
        "run_id": run.run_id,
        "job_id": created["job_id"],
        "tenant": TENANT,
        "job_type": "report.build",
        "scheduled_for": "2027-03-13T12:05:00Z",
        "available_at": "2027-03-13T12:05:00Z",
        "state": "dead",
        "attempts": 2,
        "manual": False,
        "backfill_id": None,
        "worker_id": "worker-1",
        "progress": 0.0,
        "last_error": "boom",
        "created_at": "2027-03-13T12:05:00Z",
        "first_attempt_at": "2027-03-13T12:05:01.500000Z",
        "first_started_at": "2027-03-13T12:05:01.520000Z",
        "finished_at": "2027-03-13T12:05:04Z",
        "idempotency_key": f"{created['job_id']}:2027-03-13T12:05:00Z",
        "shard_id": 3,
        "cancel_requested": False,
        "checkpoint_bytes": 0,
        "checkpoint": None,
    }

    code, out, _ = await run_cli(capsys, "runs", "get", run.run_id, "--json", *remote)
    detail = orjson.loads(out)
    assert [attempt["outcome"] for attempt in detail["attempts"]] == ["failed", "succeeded"]
    assert detail["first_started_at"] == detail["attempts"][0]["started_at"] == "2027-03-13T12:05:01.005000Z"
    assert detail["attempts"][0] == {
        "attempt": 1,
        "worker_id": "worker-1",
        "node_id": "node-a",
        "outcome": "failed",
        "dispatched_at": "2027-03-13T12:05:01Z",
        "started_at": "2027-03-13T12:05:01.005000Z",
        "finished_at": "2027-03-13T12:05:02Z",
        "error_code": "E_BOOM",
        "error_message": "boom",
        "error_traceback": None,
        "reported_late": False,
        "redelivery": True,
    }
    assert triggered["manual"] is True


async def test_cli_takes_a_payload_too_large_for_a_command_line_from_a_file(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    payload = {"rows": ["x" * 100] * 2_000}  # 200 KiB: "--payload $(cat f)" fails with "Argument list too long"
    path = tmp_path / "payload.json"
    path.write_bytes(orjson.dumps(payload))
    code, out, err = await run_cli(capsys, "jobs", "create", "--name", "big", "--type", "t", "--now",
                                   "--payload-file", str(path), "--json", "--server", daemon.address, "--tenant", TENANT)
    assert (code, err) == (0, "")
    assert orjson.loads(out)["payload"] == payload


async def test_cli_human_output_is_an_aligned_table(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    for name in ("a", "much-longer-name"):
        await run_cli(capsys, "jobs", "create", "--name", name, "--type", "t", "--every", "60", *remote)

    code, out, _ = await run_cli(capsys, "jobs", "list", *remote)

    header, *rows = out.splitlines()
    assert code == 0
    assert header.split() == ["JOB_ID", "NAME", "TYPE", "STATE", "SCHEDULE", "NEXT_FIRE_AT"]
    assert len(rows) == 2
    type_column = header.index("TYPE")
    assert all(row[type_column:].startswith("t ") for row in rows)


async def test_cli_reports_not_found_without_a_traceback(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run_cli(capsys, "jobs", "get", "missing-id", "--server", daemon.address)

    assert code == 1
    assert out == ""
    assert err.startswith("error: ") and "missing-id" in err and "Traceback" not in err


async def test_cli_errors_are_plain_sentences_and_the_status_code_comes_with_verbose_or_json(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    await run_cli(capsys, "jobs", "create", "--name", "n", "--type", "t", "--every", "60", *remote)
    other = ("jobs", "create", "--name", "n", "--type", "t", "--every", "90", *remote)  # the name, another spec
    code, _, plain = await run_cli(capsys, *other)
    _, _, verbose = await run_cli(capsys, *other, "-v")
    _, _, scripted = await run_cli(capsys, *other, "--json")
    assert code == 1 and plain.startswith("error: ") and "ALREADY_EXISTS" not in plain
    assert verbose == scripted == plain.rstrip("\n") + " (ALREADY_EXISTS)\n"


async def test_cli_lists_jobs_by_name_or_name_prefix(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    code, _, _ = await run_cli(capsys, "jobs", "list", "--name-prefix", "nig", *remote)
    assert code == 0 and daemon.state.list_jobs_requests[-1].name_prefix == "nig"
    code, _, _ = await run_cli(capsys, "jobs", "list", "--name", "nightly", *remote)
    assert code == 0 and daemon.state.list_jobs_requests[-1].name == "nightly"


async def test_cli_runs_list_sends_the_time_range(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    code, _, err = await run_cli(capsys, "runs", "list", "--since", "2026-01-01T00:00:00Z", "--until", "1h", *remote)
    assert code == 0, err
    sent = daemon.state.list_runs_requests[-1]
    assert wire.instant_in("from", sent.scheduled_from) == datetime(2026, 1, 1, tzinfo=UTC)
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    assert abs(wire.instant_in("before", sent.scheduled_before) - hour_ago) < timedelta(seconds=30)


async def test_cli_update_takes_a_payload_from_a_file_alone(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    _, out, _ = await run_cli(capsys, "jobs", "create", "--name", "n", "--type", "t", "--every", "60", "--json", *remote)
    job_id = orjson.loads(out)["job_id"]
    path = tmp_path / "payload.json"
    path.write_text('{"to": "a@b.c"}')
    code, _, err = await run_cli(capsys, "jobs", "update", job_id, "--payload-file", str(path), *remote)
    assert code == 0, err
    assert daemon.state.jobs[job_id].spec.payload == b'{"to": "a@b.c"}'


async def test_cli_a_flag_a_command_does_not_take_is_named_with_that_commands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = await run_cli(capsys, "jobs", "list", "--nmae", "x")
    assert code == 2
    assert "usage: fastlane jobs list" in err and "unrecognized arguments: --nmae x" in err


async def test_cli_cluster_lists_nodes_and_shards(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await run_cli(capsys, "cluster", "--json", "--server", daemon.address)

    view = orjson.loads(out)
    assert code == 0
    assert view["database_time"] == "2027-03-13T12:00:00Z"
    assert view["nodes"][0]["node_id"] == "node-a"
    assert [(node["ready"], node["heap_size"], node["ready_runs"]) for node in view["nodes"]] == [
        (True, 5, 0), (None, None, None)]  # the other node's own state is not known here: not "no"
    assert view["shards"][1] == {
        "shard_id": 1, "owner": None, "token": 0, "lease_expires_at": None, "lease_expires_in_seconds": None,
    }
    assert view["workers"] == [{"worker_id": "w1", "tenant": None, "job_types": ["report.build", "t"], "credits": 4,
                                "in_flight": 1, "node_id": "node-a"}]
    code, out, _ = await run_cli(capsys, "cluster", "--server", daemon.address)
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("NODE_ID"))
    ready_column = header.split().index("READY")
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("node-")}
    assert (rows["node-a"][ready_column], rows["node-b"][ready_column]) == ("yes", "-")
    assert lines[lines.index(next(line for line in lines if line.startswith("WORKER"))) + 1].split() == [
        "w1", "(all)", "report.build,t", "4", "1", "node-a"]
    assert lines[-1] == "shards: 2 (node-a: 1; unowned: 1) — --shards lists each"


async def test_cli_create_warns_when_no_connected_worker_serves_the_type(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str],
) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    code, _, served = await run_cli(capsys, "jobs", "create", "--name", "a", "--type", "report.build", "--now", *remote)
    assert code == 0 and served == ""
    code, _, unserved = await run_cli(capsys, "jobs", "create", "--name", "b", "--type", "billing.chrage", "--now",
                                      *remote)
    assert code == 0 and f"no connected worker serves job type 'billing.chrage' for tenant '{TENANT}'" in unserved


async def test_cli_list_stops_at_the_limit_and_says_so(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    for number in range(5):
        await run_cli(capsys, "jobs", "create", "--name", f"job-{number}", "--type", "t", "--now", *remote)

    code, out, _ = await run_cli(capsys, "jobs", "list", "--limit", "3", "--json", *remote)
    _, _, table_note = await run_cli(capsys, "jobs", "list", "--limit", "3", *remote)
    _, _, no_note = await run_cli(capsys, "jobs", "list", "--limit", "5", *remote)

    assert code == 0
    assert [job["name"] for job in orjson.loads(out)] == ["job-0", "job-1", "job-2"]
    assert [request.page_size for request in daemon.state.list_jobs_requests] == [3, 3, 5]
    assert "raise --limit" in table_note
    assert no_note == ""


async def test_cli_update_replaces_the_parts_given_and_keeps_the_rest(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str],
) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    code, out, _ = await run_cli(capsys, "jobs", "create", "--name", "nightly", "--type", "report.build", "--cron",
                                 "30 2 * * *", "--tz", "Europe/Paris", "--max-attempts", "7", "--priority", "5",
                                 "--json", *remote)
    job_id = orjson.loads(out)["job_id"]

    code, out, err = await run_cli(capsys, "jobs", "update", job_id, "--every", "60", "--backoff-base", "2",
                                   "--json", *remote)
    assert code == 0, err
    updated = daemon.state.jobs[job_id].spec
    assert updated.schedule == Schedule.interval(timedelta(seconds=60))
    assert (updated.retry.max_attempts, updated.retry.backoff_base) == (7, timedelta(seconds=2))  # kept, changed
    assert (updated.priority, updated.job_type, updated.name) == (5, "report.build", "nightly")
    assert orjson.loads(out)["job_id"] == job_id

    code, _, err = await run_cli(capsys, "jobs", "update", job_id, *remote)
    assert code == 2 and "nothing to change" in err
    code, _, err = await run_cli(capsys, "jobs", "update", job_id, "--concurrency-limit", "3", *remote)
    assert code != 0 and "concurrency" in err  # a limit without a key, checked against the job as it is
    assert daemon.state.jobs[job_id].spec == updated


async def test_cli_update_moves_a_cron_job_to_another_zone_with_tz_alone(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str],
) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    _, out, _ = await run_cli(capsys, "jobs", "create", "--name", "nightly", "--type", "t", "--cron", "30 2 * * *",
                              "--tz", "Europe/Paris", "--json", *remote)
    cron_id = orjson.loads(out)["job_id"]
    code, _, err = await run_cli(capsys, "jobs", "update", cron_id, "--tz", "America/New_York", *remote)
    assert code == 0, err
    assert daemon.state.jobs[cron_id].spec.schedule == Schedule.cron_expr("30 2 * * *", "America/New_York")
    code, _, err = await run_cli(capsys, "jobs", "update", cron_id, "--tz", "Mars/Olympus", *remote)
    assert code == 1 and "Mars/Olympus" in err  # an unknown zone is named
    _, out, _ = await run_cli(capsys, "jobs", "create", "--name", "often", "--type", "t", "--every", "60", "--json",
                              *remote)
    code, _, err = await run_cli(capsys, "jobs", "update", orjson.loads(out)["job_id"], "--tz", "Europe/Paris", *remote)
    assert code == 2 and "--tz alone changes the zone of a cron job" in err


async def test_cli_finds_a_job_by_its_name_as_well_as_its_id(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    _, out, _ = await run_cli(capsys, "jobs", "create", "--name", "nightly-billing", "--type", "t", "--every", "60",
                              "--json", *remote)
    job_id = orjson.loads(out)["job_id"]
    code, out, _ = await run_cli(capsys, "jobs", "get", "nightly-billing", "--json", *remote)
    assert code == 0 and orjson.loads(out)["job_id"] == job_id
    code, out, _ = await run_cli(capsys, "jobs", "pause", "nightly-billing", *remote)
    assert code == 0 and f"paused job {job_id}" in out
    run, attempts = finished_run(job_id, 1, RunState.SUCCEEDED)
    daemon.state.add_run(run, attempts)
    code, out, _ = await run_cli(capsys, "runs", "list", "--job", "nightly-billing", "--json", *remote)
    assert code == 0 and [listed["run_id"] for listed in orjson.loads(out)] == [run.run_id]
    code, out, err = await run_cli(capsys, "jobs", "get", "nightly-bill", *remote)
    assert code == 1 and out == ""
    assert "no job with the id or name 'nightly-bill' in this tenant (nor one whose id starts so; `fastlane jobs list` shows them)" in err


async def nightly_job(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> str:
    """Create the job ``nightly`` through the CLI; its id."""
    _, out, _ = await run_cli(capsys, "jobs", "create", "--name", "nightly", "--type", "report.build", "--every", "60",
                              "--json", "--server", daemon.address, "--tenant", TENANT)
    job_id: str = orjson.loads(out)["job_id"]
    return job_id


async def test_cli_runs_list_shows_job_name_lag_duration_and_progress(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str],
) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    run, attempts = finished_run(await nightly_job(daemon, capsys), 5, RunState.SUCCEEDED)
    daemon.state.add_run(replace(run, progress=0.4), attempts)
    code, out, _ = await run_cli(capsys, "runs", "list", *remote)
    header, row = out.splitlines()[:2]
    assert code == 0 and header.split() == list(RUN_COLUMNS[:-1]) + ["LAST_ERROR"]
    assert row.split() == [run.run_id, "nightly", "succeeded", "2027-03-13T12:05:00Z", "1.52", "s", "2.48", "s",
                           "2", "40%", "-"]
    code, out, _ = await run_cli(capsys, "runs", "get", run.run_id, *remote)
    assert ["progress", "40", "%"] in [line.split() for line in out.splitlines()]


async def test_cli_runs_tail_prints_the_latest_then_each_new_or_changed_run(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str],
) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    job_id = await nightly_job(daemon, capsys)
    old = [finished_run(job_id, minutes, RunState.SUCCEEDED) for minutes in range(12)]
    for run, attempts in old:
        daemon.state.add_run(run, attempts)
    tail = asyncio.create_task(run_cli(capsys, "runs", "tail", "--interval", "0.1", "--for", "3", *remote))

    async def tail_looked_again() -> None:
        """Until tail has listed the runs twice more: once may have begun before the change."""
        seen = daemon.state.list_runs_calls
        async with asyncio.timeout(10):
            while daemon.state.list_runs_calls < seen + 2:
                await asyncio.sleep(0.02)

    await tail_looked_again()
    new, attempts = finished_run(job_id, 30, RunState.SUCCEEDED)
    daemon.state.add_run(replace(new, state=RunState.RUNNING, finished_at=None), attempts)
    await tail_looked_again()
    daemon.state.add_run(new, attempts)  # it ends
    code, out, _ = await tail
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["RUN_ID", "JOB", "STATE"]
    shown = [(line.split()[0], line.split()[2]) for line in lines[1:]]
    assert shown[:10] == [(run.run_id, "succeeded") for run, _ in old[2:]]  # the latest ten, oldest first
    assert shown[10:] == [(new.run_id, "running"), (new.run_id, "succeeded")]
    assert all(line.split()[1] == "nightly" for line in lines[1:])
    # Rows come one at a time, yet line up under the header: each column starts where its title does.
    starts = [lines[0].index(title) for title in ("JOB", "STATE", "SCHEDULED_FOR", "LAG")]
    for line in lines[1:]:
        assert all(line[start - 2:start] == "  " and line[start] != " " for start in starts), line


async def test_cli_tail_as_json_prints_a_run_a_line(daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    _, out, _ = await run_cli(capsys, "jobs", "create", "--name", "nightly", "--type", "t", "--every", "60", "--json",
                              *remote)
    job_id = orjson.loads(out)["job_id"]
    runs = [finished_run(job_id, minutes, RunState.SUCCEEDED) for minutes in range(3)]
    for run, attempts in runs:
        daemon.state.add_run(run, attempts)
    code, out, _ = await run_cli(capsys, "runs", "tail", "--for", "0.3", "--interval", "0.1", "--json", *remote)
    shown = [orjson.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [(row["run_id"], row["state"], row["job_name"]) for row in shown] == [
        (run.run_id, "succeeded", "nightly") for run, _ in runs]


async def test_cli_takes_a_unique_start_of_an_id_and_says_when_a_verb_changed_nothing(
    daemon: FakeDaemon, capsys: pytest.CaptureFixture[str],
) -> None:
    remote = ("--server", daemon.address, "--tenant", TENANT)
    job_id = await nightly_job(daemon, capsys)
    run, attempts = finished_run(job_id, 1, RunState.DEAD)
    twin, _ = finished_run(job_id, 2, RunState.DEAD)
    run, twin = replace(run, run_id="0d439040-aaaa-4fdc-a738-5ade11566215"), replace(twin, run_id="0d43ffff-bbbb")
    daemon.state.add_run(run, attempts)
    daemon.state.add_run(twin, [])
    code, out, _ = await run_cli(capsys, "runs", "get", "0d439040", "--json", *remote)
    assert code == 0 and orjson.loads(out)["run_id"] == run.run_id
    code, _, err = await run_cli(capsys, "runs", "get", "0d43", *remote)
    assert code == 1 and "more than one run id starts with '0d43': give more of it" in err
    code, _, err = await run_cli(capsys, "runs", "get", "ffff", *remote)
    assert code == 1 and "no run with the id 'ffff' in this tenant" in err
    code, out, _ = await run_cli(capsys, "jobs", "get", job_id[:8], "--json", *remote)
    assert code == 0 and orjson.loads(out)["job_id"] == job_id

    code, first, _ = await run_cli(capsys, "jobs", "pause", "nightly", *remote)
    code, again, _ = await run_cli(capsys, "jobs", "pause", "nightly", *remote)
    assert code == 0 and first.startswith(f"paused job {job_id}")
    assert again.strip() == f"job {job_id} (nightly) is already paused; nothing changed"
    daemon.state.add_run(replace(run, state=RunState.CANCELLED), attempts)
    code, out, _ = await run_cli(capsys, "runs", "cancel", run.run_id, *remote)
    assert code == 0 and out.strip() == f"run {run.run_id} is already cancelled; nothing changed"
