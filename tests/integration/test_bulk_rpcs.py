"""``ActOnRuns`` and ``ActOnJobs`` through a real node and gRPC, on both backends: what a bad
request is told, an action over calls with their tokens, each item audited, and the tenant's
waiting-runs quota."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import grpc
import orjson
import pytest

from fastlane._proto import common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from fastlane.cli.main import main
from fastlane.client import Client
from fastlane.domain.models import AttemptOutcome, JobState, RetryPolicy, Run, RunState, Schedule
from fastlane.domain.quotas import TenantQuota
from fastlane.domain.records import JobAction, JobFilter, RunAction, RunFilter
from fastlane.errors import RemoteInvalidArgument, RemoteNotFound
from fastlane.rpc.channel import open_channel
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.storage import AttemptResult, Dispatch, Store, open_store
from fastlane.testing.processes import free_port

HOURLY = Schedule.interval(timedelta(hours=1))
SHARDS = 4


@dataclass
class Running:
    address: str
    store: Store


@pytest.fixture
async def node(db_url: str) -> AsyncIterator[Running]:
    address = f"127.0.0.1:{free_port()}"
    running = Node(Settings(db_url=db_url, listen=address, node_id="bulk-node", shard_count=SHARDS))
    task = asyncio.create_task(running.run(), name="bulk-node")
    store = open_store(db_url, shard_count=SHARDS)
    try:
        async with asyncio.timeout(30):
            while not running.ready.is_set():
                if task.done():
                    await task
                await asyncio.sleep(0.02)
        yield Running(address, store)
    finally:
        await store.close()
        running.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def dead_runs(client: Client, store: Store, count: int) -> list[Run]:
    """``count`` runs of one job, each dead as a worker's permanent failure leaves it."""
    job = await client.create("fragile", "t", HOURLY, retry=RetryPolicy(max_attempts=1))
    runs = [await client.trigger_job(job.job_id) for _ in range(count)]
    await store.attempts.record_dispatches([
        Dispatch(run_id=run.run_id, lease_token=1, worker_id="w", node_id="n", lease_ttl=timedelta(seconds=30),
                 dispatched_at=run.created_at) for run in runs])
    outcomes = await store.attempts.record_results(
        [AttemptResult(run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.PERMANENT_FAILURE) for run in runs])
    assert {outcome.run.state for outcome in outcomes if outcome.run is not None} == {RunState.DEAD}
    return runs


# Each bulk RPC: its stub's method, its request, and a valid action to start from.
def _act_on_runs(channel: grpc.aio.Channel, **fields: object) -> object:
    request = runs_pb2.ActOnRunsRequest(**{"action": runs_pb2.RUN_ACTION_CANCEL, **fields})
    return runs_pb2_grpc.RunServiceStub(channel).ActOnRuns(request, timeout=10)


def _act_on_jobs(channel: grpc.aio.Channel, **fields: object) -> object:
    request = jobs_pb2.ActOnJobsRequest(**{"action": jobs_pb2.JOB_ACTION_PAUSE, **fields})
    return jobs_pb2_grpc.JobServiceStub(channel).ActOnJobs(request, timeout=10)


@pytest.mark.parametrize(("rpc", "request_fields", "named"), [
    *((rpc, {"action": action}, "action") for rpc in (_act_on_runs, _act_on_jobs) for action in (0, 99)),
    *((rpc, {"limit": limit}, "limit") for rpc in (_act_on_runs, _act_on_jobs) for limit in (10_001, -1)),
    *((rpc, {"page_token": "not-a-token"}, "page_token") for rpc in (_act_on_runs, _act_on_jobs)),
    (_act_on_runs, {"selection": runs_pb2.RunSelection(states=[common_pb2.RUN_STATE_DEAD, 99])}, "selection.states[1]"),
    (_act_on_runs, {"selection": runs_pb2.RunSelection(job_type="not a type!")}, "selection.job_type"),
    (_act_on_runs, {"selection": runs_pb2.RunSelection(job_id="x" * 201)}, "selection.job_id"),
    (_act_on_jobs, {"selection": jobs_pb2.JobSelection(states=[common_pb2.JOB_STATE_PAUSED, 99])}, "selection.states[1]"),
    (_act_on_jobs, {"selection": jobs_pb2.JobSelection(job_type="not a type!")}, "selection.job_type"),
    (_act_on_jobs, {"reason": "tab\tinside"}, "reason"),
    (_act_on_jobs, {"action": jobs_pb2.JOB_ACTION_DELETE, "reason": "why"}, "reason"),  # a pause's only
])
async def test_a_bad_bulk_request_is_refused_naming_its_field(node: Running, rpc, request_fields, named) -> None:
    async with open_channel(node.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rpc(channel, **request_fields)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert named in (refused.value.details() or "")


async def test_dead_runs_are_retried_call_after_call_and_each_retry_is_audited(node: Running) -> None:
    async with Client(node.address) as client:
        runs = await dead_runs(client, node.store, 5)
        job_id = runs[0].job_id
        assert (await client.act_on_runs(RunAction.RETRY, RunFilter(job_id=job_id), dry_run=True)).matched == 5
        first = await client.act_on_runs("retry", RunFilter(job_id=job_id), limit=3)
        assert (first.matched, first.acted, first.skipped) == (3, 3, 0) and first.next_page_token
        rest = await client.act_on_runs("retry", RunFilter(job_id=job_id), limit=3, page_token=first.next_page_token)
        assert (rest.matched, rest.acted, rest.next_page_token) == (2, 2, "")
        for run in runs:
            again, _ = await client.get_run(run.run_id)
            assert again.state is RunState.SCHEDULED
            assert [event.action.value for event in await client.list_audit("run", run.run_id)] == \
                ["retried", "triggered"]
        # Nothing dead is left: a second pass takes nothing.
        assert (await client.act_on_runs("retry", RunFilter(job_id=job_id))).matched == 0


async def test_a_retry_over_the_tenants_waiting_quota_stops_and_says_why(node: Running) -> None:
    async with Client(node.address) as client:
        runs = await dead_runs(client, node.store, 4)
        await client.set_quota("default", TenantQuota(max_waiting_runs=2))
        outcomes = [outcome async for outcome in client.act_on_all_runs("retry", RunFilter(job_id=runs[0].job_id))]
    [outcome] = outcomes  # stopped short: the iterator ends there
    assert (outcome.matched, outcome.acted) == (2, 2)
    assert "max_waiting_runs" in outcome.stopped_because and outcome.next_page_token


async def test_jobs_of_a_type_are_paused_resumed_and_deleted_call_after_call_each_audited(node: Running) -> None:
    billing = JobFilter(job_type="billing.close")
    async with Client(node.address) as client:
        jobs = [await client.create(f"close-{index}", "billing.close", HOURLY) for index in range(5)]
        other = await client.create("report", "reports.daily", HOURLY)
        assert (await client.act_on_jobs(JobAction.PAUSE, billing, dry_run=True)).matched == 5
        first = await client.act_on_jobs("pause", billing, limit=3)
        assert (first.matched, first.acted, first.skipped) == (3, 3, 0) and first.next_page_token
        rest = await client.act_on_jobs("pause", billing, limit=3, page_token=first.next_page_token)
        assert (rest.matched, rest.acted, rest.next_page_token) == (2, 2, "")
        for job in jobs:
            paused = await client.get_job(job.job_id)
            assert paused.state is JobState.PAUSED
            assert [event.action.value for event in await client.list_audit("job", job.job_id)] == ["paused", "created"]
        assert (await client.get_job(other.job_id)).state is JobState.ACTIVE
        # Nothing of the type is active now: a second pause takes nothing.
        assert (await client.act_on_jobs("pause", billing)).matched == 0

        # A resume takes paused jobs; naming a state narrows it (here to none of them: errored).
        none_errored = JobFilter(job_type="billing.close", states=frozenset({JobState.ERRORED}))
        assert (await client.act_on_jobs("resume", none_errored, dry_run=True)).matched == 0
        outcomes = [outcome async for outcome in client.act_on_all_jobs("resume", billing, limit=2)]
        assert [outcome.acted for outcome in outcomes] == [2, 2, 1]
        resumed = [await client.get_job(job.job_id) for job in jobs]
        assert {job.state for job in resumed} == {JobState.ACTIVE}
        assert all(job.next_fire_at is not None for job in resumed)

        deleted = await client.act_on_jobs(JobAction.DELETE, billing)
        assert (deleted.matched, deleted.acted) == (5, 5)
        for job in jobs:
            with pytest.raises(RemoteNotFound):
                await client.get_job(job.job_id)
            assert (await client.list_audit("job", job.job_id))[0].action.value == "deleted"
        assert [job.job_id for job in (await client.list_jobs()).items] == [other.job_id]


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    # main() runs its own event loop, so it runs in a thread while this loop serves the node.
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_a_pause_keeps_its_reason_until_the_resume_in_the_job_its_history_and_the_cli(
        node: Running, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", node.address)
    async with Client(node.address) as client:
        job = await client.create("ledger-close", "billing.close", HOURLY)
        other = await client.create("ledger-open", "billing.close", HOURLY)
        code, out, err = await run_cli(capsys, "jobs", "pause", "ledger-close", "--reason", "  ledger migration  ",
                                       *remote)
        assert code == 0 and out.strip().endswith("; reason: ledger migration"), err
        paused = await client.get_job(job.job_id)
        assert (paused.state, paused.pause_reason) == (JobState.PAUSED, "ledger migration")
        assert [(event.action.value, event.detail) for event in await client.list_audit("job", job.job_id)][0] == \
            ("paused", "ledger migration")
        code, out, _ = await run_cli(capsys, "jobs", "list", *remote)
        assert "paused (ledger migration)" in out
        code, out, _ = await run_cli(capsys, "jobs", "get", "ledger-close", "--json", *remote)
        assert orjson.loads(out)["pause_reason"] == "ledger migration"
        # A second pause changes nothing, the reason included.
        assert (await client.pause_job(job.job_id, "another")).pause_reason == "ledger migration"
        resumed = await client.resume_job(job.job_id)
        assert (resumed.state, resumed.pause_reason) == (JobState.ACTIVE, None)

        # A bulk pause gives each job the reason; a reason is a pause's only.
        outcome = await client.act_on_jobs(JobAction.PAUSE, JobFilter(job_type="billing.close"), reason="quarter end")
        assert (outcome.matched, outcome.acted) == (2, 2)
        assert {(await client.get_job(j.job_id)).pause_reason for j in (job, other)} == {"quarter end"}
        assert (await client.list_audit("job", other.job_id))[0].detail == "quarter end"
        with pytest.raises(RemoteInvalidArgument, match="reason"):
            await client.act_on_jobs(JobAction.RESUME, JobFilter(), reason="why not")


@pytest.mark.parametrize("reason", ["x" * 201, "tab\tinside", "bell\x07"])
async def test_a_pause_reason_over_its_bounds_is_refused_naming_it(node: Running, reason: str) -> None:
    async with Client(node.address) as client:
        job = await client.create("bounded", "t", HOURLY)
        with pytest.raises(RemoteInvalidArgument, match="reason"):
            await client.pause_job(job.job_id, reason)
        with pytest.raises(RemoteInvalidArgument, match="reason"):
            await client.act_on_jobs(JobAction.PAUSE, JobFilter(), reason=reason)
        assert (await client.get_job(job.job_id)).state is JobState.ACTIVE


async def test_a_second_delete_succeeds_as_a_second_pause_does_and_an_unknown_id_is_still_refused(
        node: Running, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--server", node.address)
    async with Client(node.address) as client, Client(node.address, tenant="globex") as other_tenant:
        job = await client.create("nightly-export", "export", HOURLY)
        code, out, err = await run_cli(capsys, "jobs", "delete", job.job_id, *remote)
        assert (code, out.strip()) == (0, f"deleted job {job.job_id}"), err
        code, out, err = await run_cli(capsys, "jobs", "delete", job.job_id, *remote)
        assert (code, out.strip()) == (0, f"job {job.job_id} was deleted before; nothing changed"), err
        code, out, _ = await run_cli(capsys, "jobs", "delete", job.job_id, "--json", *remote)
        assert orjson.loads(out) == {"job_id": job.job_id, "deleted": False, "already_deleted": True}
        assert await client.delete_job(job.job_id) is False  # the API says so too
        # Only the history of its own tenant says so: another tenant's delete of that id is refused.
        with pytest.raises(RemoteNotFound):
            await other_tenant.delete_job(job.job_id)
        # An id never used, and a deleted job's name (it no longer has one), are refused.
        code, _, err = await run_cli(capsys, "jobs", "delete", "7d1e0a52-0000-4000-8000-000000000000", *remote)
        assert code == 1 and "no job with the id or name" in err
        code, _, err = await run_cli(capsys, "jobs", "delete", "nightly-export", *remote)
        assert code == 1 and "no job with the id or name 'nightly-export'" in err
        # One audited delete: the repeated ones changed nothing.
        assert [event.action.value for event in await client.list_audit("job", job.job_id)].count("deleted") == 1
