"""Enumerations at the API, on a real node: an unspecified value takes the field's documented
default (in a filter: any), a number the node does not know is refused with INVALID_ARGUMENT
naming the field, and nothing of it crosses a tenant."""

from __future__ import annotations

import grpc
import pytest

from fastlane._proto import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from fastlane.domain.models import OverlapPolicy, RunState
from fastlane.rpc.channel import open_channel
from fastlane.testing import until

WAIT = 10.0


async def refused_details(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    return refused.value.details() or ""


def spec(name: str, **fields: int) -> common_pb2.JobSpec:
    return common_pb2.JobSpec(name=name, job_type="t", schedule=common_pb2.Schedule(now=common_pb2.Now()), **fields)


async def test_unspecified_takes_the_default_and_an_unknown_number_is_refused_naming_the_field(secured):
    channel = open_channel(secured.address, token=secured.secrets["client-a"])
    jobs, runs = jobs_pb2_grpc.JobServiceStub(channel), runs_pb2_grpc.RunServiceStub(channel)
    try:
        created = await jobs.CreateJob(jobs_pb2.CreateJobRequest(spec=spec("plain")), timeout=WAIT)
        assert created.job.spec.overlap == common_pb2.OVERLAP_POLICY_ALLOW  # unspecified: allow
        assert "spec.overlap" in await refused_details(
            jobs.CreateJob(jobs_pb2.CreateJobRequest(spec=spec("odd", overlap=77)), timeout=WAIT))
        assert "state" in await refused_details(jobs.ListJobs(jobs_pb2.ListJobsRequest(state=77), timeout=WAIT))

        async with secured.client("client-a") as client:
            async def listed() -> list[str]:
                return [run.run_id for run in (await client.list_runs()).items]

            # The one-shot job's run is written by the node a moment after the job, not with it.
            every = await until(listed, WAIT, "the one-shot job's run to be listed")
        unfiltered = await runs.ListRuns(runs_pb2.ListRunsRequest(states=[common_pb2.RUN_STATE_UNSPECIFIED]),
                                         timeout=WAIT)
        assert [run.run_id for run in unfiltered.runs] == every  # an unspecified entry adds nothing: any
        assert "states[1]" in await refused_details(
            runs.ListRuns(runs_pb2.ListRunsRequest(states=[common_pb2.RUN_STATE_DEAD, 77]), timeout=WAIT))
    finally:
        await channel.close()
    async with secured.client("client-a") as client:
        assert (await client.get_job(created.job.job_id)).spec.overlap is OverlapPolicy.ALLOW
    async with secured.client("client-b") as other:  # the other tenant sees none of it, filtered or not
        assert (await other.list_runs()).items == []
        assert (await other.list_runs(states=list(RunState))).items == []
