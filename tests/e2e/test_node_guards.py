"""What once knocked a real node over: each request, job or start-up below stopped the daemon.

Every test runs against a real ``fastlane serve`` process and checks both the answer and that
the node is still alive and serving afterwards.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import grpc
import orjson
import pytest
from e2e_support import Daemon, Process, Recorder, free_port, wait_for
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastlane._proto import common_pb2 as pb
from fastlane._proto import jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from fastlane.domain.models import RetryPolicy, RunState, Schedule

pytestmark = pytest.mark.e2e

YEAR_1 = Timestamp(seconds=-62_135_596_800)
YEAR_9999 = Timestamp(seconds=253_402_300_799)
EIGHT_THOUSAND_YEARS = Duration(seconds=8000 * 366 * 86_400)


def spec(**fields: object) -> pb.JobSpec:
    base: dict[str, object] = {"name": "guarded", "job_type": "e2e", "schedule": pb.Schedule(now=pb.Now())}
    return pb.JobSpec(**{**base, **fields})


BAD_REQUESTS = [
    ("CreateJob", jobs_pb2.CreateJobRequest(spec=spec(schedule=pb.Schedule(at=YEAR_1))), "spec.schedule.at"),
    ("CreateJob", jobs_pb2.CreateJobRequest(spec=spec(schedule=pb.Schedule(
        interval=pb.Interval(every=EIGHT_THOUSAND_YEARS)))), "spec.schedule.interval.every"),
    ("CreateJob", jobs_pb2.CreateJobRequest(spec=spec(lease_ttl=Duration(seconds=9000 * 366 * 86_400))), "spec.lease_ttl"),
    ("CreateJob", jobs_pb2.CreateJobRequest(spec=spec(timeout=Duration(seconds=10**18))), "spec.timeout"),
    ("CreateJob", jobs_pb2.CreateJobRequest(spec=spec(retry=pb.RetryPolicy(max_attempts=10**6))), "spec.retry.max_attempts"),
    ("CreateJob", jobs_pb2.CreateJobRequest(spec=spec(tenant="a\x00b")), "tenant"),
    ("GetJob", jobs_pb2.GetJobRequest(job_id="nul\x00id"), "job_id"),
    ("DeleteJob", jobs_pb2.DeleteJobRequest(job_id="x" * 5_000), "job_id"),
    ("ListJobs", jobs_pb2.ListJobsRequest(page_token="5b5d"), "page_token"),
    ("ListJobs", jobs_pb2.ListJobsRequest(page_size=-1), "page_size"),
    ("PreviewSchedule", jobs_pb2.PreviewScheduleRequest(
        schedule=pb.Schedule(cron=pb.Cron(expression="* * * * *")), after=YEAR_1), "after"),
    ("PreviewSchedule", jobs_pb2.PreviewScheduleRequest(
        schedule=pb.Schedule(cron=pb.Cron(expression="* * * * *")), after=YEAR_9999), "after"),
]


async def test_bad_requests_are_refused_naming_the_field_and_the_node_stays_up(daemon: Daemon):
    async with grpc.aio.insecure_channel(daemon.address) as channel:
        jobs = jobs_pb2_grpc.JobServiceStub(channel)
        runs = runs_pb2_grpc.RunServiceStub(channel)
        for method, request, field in BAD_REQUESTS:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await getattr(jobs, method)(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, field, refused.value.details())
            assert field in refused.value.details(), (method, refused.value.details())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await runs.ListRuns(runs_pb2.ListRunsRequest(page_token="5b5d"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert daemon.popen is not None and daemon.popen.poll() is None


async def test_a_run_that_fails_a_hundred_times_ends_dead_and_the_node_lives(daemon: Daemon, recorder: Recorder, client):
    """The backoff of the ~58th attempt (1 ms base) once overflowed and the node exited, again on
    every restart."""
    retry = RetryPolicy(max_attempts=100, backoff_base=timedelta(milliseconds=1), backoff_cap=timedelta(milliseconds=2))
    job = await client.create("always-fails", "e2e", Schedule.now(), payload=orjson.dumps({"fail_until_attempt": 10_000}),
                              retry=retry)

    async def dead_run():  # type: ignore[no-untyped-def]
        page = await client.list_runs(job_id=job.job_id, states=[RunState.DEAD])
        return page.items

    [run] = await wait_for(dead_run, 90, "the run to die after 100 attempts")
    assert run.attempts == 100
    assert daemon.popen is not None and daemon.popen.poll() is None
    await client.wait_ready(5)


def test_a_second_node_on_a_taken_port_refuses_to_start(daemon: Daemon, tmp_path, processes):  # type: ignore[no-untyped-def]
    second = Process(
        [sys.executable, "-m", "fastlane", "serve", "--db", f"sqlite:///{tmp_path}/second.db",
         "--listen", daemon.address, "--metrics", f"127.0.0.1:{free_port()}"],
        tmp_path / "second.log",
    )
    second.start()
    processes.append(second)
    assert second.popen is not None
    assert second.popen.wait(30) != 0
    assert "address is in use" in second.log_path.read_text()
    assert daemon.popen is not None and daemon.popen.poll() is None


async def test_listings_leave_payloads_out_unless_asked(daemon: Daemon, client):  # type: ignore[no-untyped-def]
    """A page of a thousand 1 MiB payloads would be a gigabyte held for one answer."""
    payload = b"p" * 100_000
    job = await client.create("heavy", "e2e", Schedule.cron_expr("0 0 1 1 *"), payload=payload)
    [listed] = (await client.list_jobs()).items
    assert listed.job_id == job.job_id and listed.spec.payload == b""
    [with_payload] = (await client.list_jobs(include_payload=True)).items
    assert with_payload.spec.payload == payload
    assert (await client.get_job(job.job_id)).spec.payload == payload


async def test_a_node_restarted_after_a_crash_serves_only_once_it_owns_its_shards(db_url, tmp_path, processes):  # type: ignore[no-untyped-def]
    """After SIGKILL the old incarnation's leases are held until they run out. The restarted
    node once said SERVING at once while owning no shard, and a job fired seconds late."""
    first = Daemon(db_url, tmp_path / "first.log", extra_args=["--shard-lease-ttl", "4"])
    first.start()
    processes.append(first)
    await first.wait_ready()
    first.kill()
    again = Daemon(db_url, tmp_path / "again.log", extra_args=["--shard-lease-ttl", "4"])
    again.start()
    processes.append(again)
    async with grpc.aio.insecure_channel(again.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)

        async def serving() -> bool:
            try:
                answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
            except grpc.aio.AioRpcError:
                return False
            return answer.status == health_pb2.HealthCheckResponse.SERVING

        await wait_for(serving, 30, "the restarted node to serve")
    samples = again.metrics()
    assert samples["fastlane_shards_owned"] == 8, "SERVING before owning its shards"
