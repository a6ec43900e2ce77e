"""Tenants are a boundary: under ``--auth`` a caller sees and touches only its token's tenant.

Every RPC of the job and run services is tried by a client of tenant ``a`` against tenant ``b``'s
job and run, by id and by naming the tenant; workers of ``a`` never receive ``b``'s runs and cannot
report on them. Real node and gRPC, both backends.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from secured_nodes import ENGINE_SHARDS, secured_node

from fastlane._proto import common_pb2
from fastlane._proto import workers_pb2 as pb
from fastlane._proto import workers_pb2_grpc as pb_grpc
from fastlane.domain.models import JobSpec, JobState, RunState, Schedule
from fastlane.domain.records import JobAction, JobFilter, RunAction, RunFilter
from fastlane.errors import RemoteError
from fastlane.rpc.channel import open_channel
from fastlane.testing.processes import free_port
from fastlane.worker import RunContext, Worker

WAIT = 20.0
HOURLY = Schedule.interval(timedelta(hours=1))


async def refused(call, code: grpc.StatusCode) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RemoteError) as error:
        await call
    assert error.value.code is code, error.value


async def test_a_client_of_one_tenant_sees_and_touches_nothing_of_another(secured):
    node = secured
    async with node.client("client-a") as a, node.client("client-b") as b, node.client("admin") as admin:
        theirs = await b.create("payroll", "t", HOURLY, payload={"iban": "secret"})
        their_run = await b.trigger_job(theirs.job_id)
        assert theirs.tenant == "b"
        mine = await a.create("reports", "t", HOURLY)
        assert mine.tenant == "a"

        # Listing: only a's own, and naming b is refused.
        assert [job.job_id for job in (await a.list_jobs()).items] == [mine.job_id]
        assert all(run.tenant == "a" for run in (await a.list_runs()).items)
        async with node.client("client-a", tenant="b") as a_as_b:
            await refused(a_as_b.list_jobs(), grpc.StatusCode.PERMISSION_DENIED)
            await refused(a_as_b.list_runs(), grpc.StatusCode.PERMISSION_DENIED)
            await refused(a_as_b.get_job(theirs.job_id), grpc.StatusCode.PERMISSION_DENIED)
            await refused(a_as_b.get_run(their_run.run_id), grpc.StatusCode.PERMISSION_DENIED)
            await refused(a_as_b.delete_job(theirs.job_id), grpc.StatusCode.PERMISSION_DENIED)
            await refused(a_as_b.create("intruder", "t", HOURLY), grpc.StatusCode.PERMISSION_DENIED)

        # By id, within a's own tenant: b's job and run do not exist.
        not_found = grpc.StatusCode.NOT_FOUND
        await refused(a.get_job(theirs.job_id), not_found)
        await refused(a.pause_job(theirs.job_id), not_found)
        await refused(a.resume_job(theirs.job_id), not_found)
        await refused(a.trigger_job(theirs.job_id), not_found)
        await refused(a.update_job(theirs.job_id, JobSpec(name="payroll", job_type="t", schedule=HOURLY)), not_found)
        await refused(a.delete_job(theirs.job_id), not_found)
        await refused(a.get_run(their_run.run_id), not_found)
        await refused(a.cancel_run(their_run.run_id), not_found)
        await refused(a.retry_run(their_run.run_id), not_found)
        assert (await a.list_runs(job_id=theirs.job_id)).items == []
        assert (await a.list_jobs(name="payroll")).items == []  # nor by its name
        assert (await a.list_jobs(id_prefix=theirs.job_id[:8])).items == []  # nor by the start of its id
        assert (await a.list_jobs(name_prefix="pay")).items == []  # nor of its name
        assert [job.name for job in (await b.list_jobs(name_prefix="pay")).items] == ["payroll"]
        assert (await a.list_runs(id_prefix=their_run.run_id[:8])).items == []
        around = their_run.scheduled_for - timedelta(hours=1)  # nor in a time range that holds it
        assert (await a.list_runs(scheduled_from=around)).items == []
        assert [run.run_id for run in (await b.list_runs(scheduled_from=around)).items] == [their_run.run_id]
        await refused(b.list_runs(scheduled_from=around, scheduled_before=around), grpc.StatusCode.INVALID_ARGUMENT)

        # A spec naming tenant b, sent by a's client, is refused too.
        with pytest.raises(RemoteError) as spec_for_b:
            async with node.client("client-a", tenant="b") as sneaky:
                await sneaky.create_job(JobSpec(tenant="b", name="x", job_type="t", schedule=HOURLY))
        assert spec_for_b.value.code is grpc.StatusCode.PERMISSION_DENIED

        # b's job and run are untouched; an admin may act for b by naming it.
        job = await b.get_job(theirs.job_id)
        assert (job.state, job.spec.name, job.spec.payload) == (theirs.state, "payroll", theirs.spec.payload)
        run, _ = await b.get_run(their_run.run_id)
        assert run.state is RunState.SCHEDULED
        async with node.client("admin", tenant="b") as admin_for_b:
            assert [j.job_id for j in (await admin_for_b.list_jobs()).items] == [theirs.job_id]
        assert (await admin.list_jobs()).items == []  # the admin's own tenant, "ops"


async def test_a_bulk_action_takes_only_the_runs_of_the_callers_tenant(secured):
    node = secured
    async with node.client("client-a") as a, node.client("client-b") as b:
        theirs = await b.create("payroll", "shared.type", HOURLY)
        their_runs = [await b.trigger_job(theirs.job_id) for _ in range(3)]
        mine = await a.create("reports", "shared.type", HOURLY)
        my_run = await a.trigger_job(mine.job_id)
        same_type = RunFilter(job_type="shared.type")
        # The same selection counts and cancels a's runs only: by type, and by b's job id.
        assert (await a.act_on_runs(RunAction.CANCEL, same_type, dry_run=True)).matched == 1
        assert (await a.act_on_runs(RunAction.CANCEL, RunFilter(job_id=theirs.job_id), dry_run=True)).matched == 0
        cancelled = await a.act_on_runs(RunAction.CANCEL, same_type)
        assert (cancelled.matched, cancelled.acted) == (1, 1)
        assert (await a.get_run(my_run.run_id))[0].state is RunState.CANCELLED
        assert {(await b.get_run(run.run_id))[0].state for run in their_runs} == {RunState.SCHEDULED}
        # Naming b is refused, counting or acting, before anything is read.
        async with node.client("client-a", tenant="b") as a_as_b:
            await refused(a_as_b.act_on_runs(RunAction.CANCEL, same_type, dry_run=True),
                          grpc.StatusCode.PERMISSION_DENIED)
            await refused(a_as_b.act_on_runs(RunAction.CANCEL, same_type), grpc.StatusCode.PERMISSION_DENIED)
        assert (await b.act_on_runs(RunAction.CANCEL, same_type, dry_run=True)).matched == 3
    async with node.client("viewer-a") as viewer:  # a viewer may look, not act
        await refused(viewer.act_on_runs(RunAction.CANCEL, same_type, dry_run=True), grpc.StatusCode.PERMISSION_DENIED)


async def test_a_bulk_action_on_jobs_takes_only_the_callers_jobs(secured):
    node = secured
    same_type = JobFilter(job_type="shared.type")
    async with node.client("client-a") as a, node.client("client-b") as b:
        theirs = [await b.create(f"payroll-{index}", "shared.type", HOURLY) for index in range(3)]
        mine = await a.create("reports", "shared.type", HOURLY)
        assert (await a.act_on_jobs(JobAction.DELETE, same_type, dry_run=True)).matched == 1
        paused = await a.act_on_jobs(JobAction.PAUSE, same_type)
        assert (paused.matched, paused.acted) == (1, 1)
        assert (await a.get_job(mine.job_id)).state is JobState.PAUSED
        deleted = await a.act_on_jobs(JobAction.DELETE, JobFilter())
        assert (deleted.matched, deleted.acted) == (1, 1)
        assert {(await b.get_job(job.job_id)).state for job in theirs} == {JobState.ACTIVE}
        async with node.client("client-a", tenant="b") as a_as_b:
            await refused(a_as_b.act_on_jobs(JobAction.PAUSE, same_type, dry_run=True),
                          grpc.StatusCode.PERMISSION_DENIED)
            await refused(a_as_b.act_on_jobs(JobAction.DELETE, same_type), grpc.StatusCode.PERMISSION_DENIED)
        assert (await b.act_on_jobs(JobAction.PAUSE, same_type, dry_run=True)).matched == 3
    async with node.client("viewer-a") as viewer:  # a viewer may look, not act
        await refused(viewer.act_on_jobs(JobAction.PAUSE, same_type, dry_run=True), grpc.StatusCode.PERMISSION_DENIED)


async def test_a_backfill_reaches_only_the_callers_jobs_and_its_runs_only_the_callers_listings(secured):
    node = secured
    start = datetime.now(UTC) - timedelta(hours=2, minutes=30)  # fire times start, +1 h, +2 h
    hourly = Schedule.interval(timedelta(hours=1), start)
    async with node.client("client-a") as a, node.client("client-b") as b:
        theirs = await b.create("payroll", "shared.type", hourly)
        await refused(a.backfill_job(theirs.job_id, start, datetime.now(UTC)), grpc.StatusCode.NOT_FOUND)
        await refused(a.backfill_job(theirs.job_id, start, datetime.now(UTC), dry_run=True),
                      grpc.StatusCode.NOT_FOUND)
        async with node.client("client-a", tenant="b") as a_as_b:
            await refused(a_as_b.backfill_job(theirs.job_id, start, datetime.now(UTC)),
                          grpc.StatusCode.PERMISSION_DENIED)
        first = await b.backfill_job(theirs.job_id, start, datetime.now(UTC), limit=1)
        assert first.written == 1 and first.next_page_token
        # b's token, in a's hands: not for a's job, and b's job is not a's.
        mine = await a.create("reports", "shared.type", hourly)
        await refused(a.backfill_job(mine.job_id, page_token=first.next_page_token),
                      grpc.StatusCode.INVALID_ARGUMENT)
        await refused(a.backfill_job(theirs.job_id, page_token=first.next_page_token), grpc.StatusCode.NOT_FOUND)
        rest = await b.backfill_job(theirs.job_id, page_token=first.next_page_token)
        assert rest.written == 2 and rest.backfill_id == first.backfill_id and not rest.next_page_token
        # b's backfill id, given by a: no run of it to see, count or cancel.
        assert (await a.list_runs(backfill_id=first.backfill_id)).items == []
        by_backfill = RunFilter(backfill_id=first.backfill_id)
        assert (await a.act_on_runs(RunAction.CANCEL, by_backfill, dry_run=True)).matched == 0
        assert len((await b.list_runs(backfill_id=first.backfill_id)).items) == 3
        assert (await b.act_on_runs(RunAction.CANCEL, by_backfill, dry_run=True)).matched == 3
    async with node.client("viewer-a") as viewer:  # a viewer may look, not backfill
        await refused(viewer.backfill_job(mine.job_id, start, datetime.now(UTC), dry_run=True),
                      grpc.StatusCode.PERMISSION_DENIED)


async def test_a_worker_receives_only_the_runs_of_its_token_tenant(secured):
    node = secured
    received: dict[str, list[str]] = {"a": [], "b": []}
    arrived = asyncio.Event()

    def worker_of(tenant: str) -> Worker:
        worker = Worker(node.address, worker_id="shared-name", concurrency=8, follow_cluster=False,
                        token=node.secrets[f"worker-{tenant}"])

        @worker.handler("t")
        async def handle(ctx: RunContext) -> None:
            assert ctx.tenant == tenant
            received[tenant].append(ctx.run_id)
            arrived.set()

        return worker

    async with node.client("client-a") as a, node.client("client-b") as b:
        job_a = await a.create("ja", "t", HOURLY)
        job_b = await b.create("jb", "t", HOURLY)
        worker_a = worker_of("a")
        task_a = asyncio.create_task(worker_a.run())
        try:
            run_a = await a.trigger_job(job_a.job_id)
            run_b = await b.trigger_job(job_b.job_id)
            async with asyncio.timeout(WAIT):
                while (await a.get_run(run_a.run_id))[0].state is not RunState.SUCCEEDED:
                    await asyncio.sleep(0.05)
            # Only a's worker is connected: b's run waits for a worker of b.
            assert received["a"] == [run_a.run_id]
            assert (await b.get_run(run_b.run_id))[0].state is RunState.SCHEDULED

            worker_b = worker_of("b")
            task_b = asyncio.create_task(worker_b.run())
            try:
                async with asyncio.timeout(WAIT):
                    while (await b.get_run(run_b.run_id))[0].state is not RunState.SUCCEEDED:
                        await asyncio.sleep(0.05)
                _, attempts = await b.get_run(run_b.run_id)
                assert [attempt.worker_id for attempt in attempts] == ["b#shared-name"]
            finally:
                await asyncio.wait_for(worker_b.stop(), WAIT)
                await asyncio.wait_for(task_b, WAIT)
            assert received == {"a": [run_a.run_id], "b": [run_b.run_id]}
        finally:
            await asyncio.wait_for(worker_a.stop(), WAIT)
            await asyncio.wait_for(task_a, WAIT)


class RawStream:
    """A worker stream spoken by hand, to send what the SDK never would."""

    def __init__(self, address: str, token: str) -> None:
        self.channel = open_channel(address, token=token)
        self.outgoing: asyncio.Queue[pb.ConnectRequest | None] = asyncio.Queue()
        self.call = pb_grpc.WorkerServiceStub(self.channel).Connect(self._requests())

    async def _requests(self):  # type: ignore[no-untyped-def]
        while (message := await self.outgoing.get()) is not None:
            yield message

    def send(self, **body) -> None:  # type: ignore[no-untyped-def]
        self.outgoing.put_nowait(pb.ConnectRequest(**body))

    async def read(self) -> pb.ConnectResponse:
        async with asyncio.timeout(WAIT):
            message = await self.call.read()
        assert message is not grpc.aio.EOF
        return message

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        self.call.cancel()
        await self.channel.close()


async def test_a_worker_token_cannot_ask_for_another_tenant_runs(secured):
    stream = RawStream(secured.address, secured.secrets["worker-a"])
    try:
        stream.send(hello=pb.Hello(worker_id="w", job_types=["t"], credits=1, tenant="b"))
        with pytest.raises(grpc.aio.AioRpcError) as refused_hello:
            await stream.read()
        assert refused_hello.value.code() is grpc.StatusCode.PERMISSION_DENIED
    finally:
        await stream.close()


async def test_reports_on_another_tenant_attempt_are_refused(secured):
    node = secured
    async with node.client("client-b") as b:
        job = await b.create("victim", "t", HOURLY)
        victim = RawStream(node.address, node.secrets["worker-b"])
        attacker = RawStream(node.address, node.secrets["worker-a"])
        try:
            victim.send(hello=pb.Hello(worker_id="same-id", job_types=["t"], credits=1))
            assert (await victim.read()).WhichOneof("body") == "welcome"
            run = await b.trigger_job(job.job_id)
            while (message := await victim.read()).WhichOneof("body") != "assignments":
                pass
            assignment = message.assignments.assignments[0]
            assert assignment.run_id == run.run_id

            # a's worker, under the same worker id, knows the run id and lease token: it still
            # cannot end the attempt, heartbeat it or replace its checkpoint.
            attacker.send(hello=pb.Hello(worker_id="same-id", job_types=["t"], credits=1))
            assert (await attacker.read()).WhichOneof("body") == "welcome"
            attacker.send(heartbeats=pb.Heartbeats(beats=[pb.RunHeartbeat(
                run_id=run.run_id, lease_token=assignment.lease_token, started=True, checkpoint=b"forged")]))
            attacker.send(results=pb.Results(results=[pb.RunResult(
                run_id=run.run_id, lease_token=assignment.lease_token, outcome=common_pb2.ATTEMPT_OUTCOME_PERMANENT_FAILURE,
                error_code="Forged", error_message="sent by another tenant")]))
            victim.send(results=pb.Results(results=[pb.RunResult(
                run_id=run.run_id, lease_token=assignment.lease_token, outcome=common_pb2.ATTEMPT_OUTCOME_SUCCEEDED)]))
            while (message := await victim.read()).WhichOneof("body") != "acks":
                pass

            settled, attempts = await b.get_run(run.run_id)
            assert settled.state is RunState.SUCCEEDED
            assert settled.checkpoint is None
            assert [(attempt.worker_id, attempt.error_code) for attempt in attempts] == [("b#same-id", None)]
        finally:
            await victim.close()
            await attacker.close()


async def test_an_open_worker_stream_ends_when_its_token_is_revoked(secured):
    node = secured
    stream = RawStream(node.address, node.secrets["worker-a"])
    try:
        stream.send(hello=pb.Hello(worker_id="w", job_types=["t"], credits=1))
        assert (await stream.read()).WhichOneof("body") == "welcome"
        await node.store.tokens.revoke_token(node.tokens["worker-a"].token_id)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while True:
                await stream.read()
        assert ended.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (ended.value.details() or "")
    finally:
        await stream.close()


async def test_a_worker_with_a_refused_token_says_so_once_and_waits(secured, caplog):
    worker = Worker(secured.address, concurrency=1, follow_cluster=False, token="fl_zzzzzzzzzzzz_" + "0" * 64)

    @worker.handler("t")
    async def handle(ctx: RunContext) -> None:
        raise AssertionError("a refused worker runs nothing")

    caplog.set_level("INFO", logger="fastlane.worker")
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(WAIT):
            while not any(r.levelname == "ERROR" and "refused this worker" in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.05)
    finally:
        await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(task, WAIT)
    refusals = [r.getMessage() for r in caplog.records if "refused this worker" in r.getMessage()]
    assert len(refusals) == 1
    assert "UNAUTHENTICATED" in refusals[0] and "--token-file" in refusals[0]


async def test_the_cluster_lists_a_tenant_only_its_own_workers_and_an_admin_all(secured):
    node = secured
    workers = {tenant: Worker(node.address, worker_id=f"w-{tenant}", concurrency=3, follow_cluster=False,
                              token=node.secrets[f"worker-{tenant}"]) for tenant in ("a", "b")}
    for tenant, worker in workers.items():
        worker.handler(f"type-of-{tenant}")(_noop)
    tasks = [asyncio.create_task(worker.run()) for worker in workers.values()]
    try:
        async with node.client("admin") as admin, node.client("client-a") as a, node.client("viewer-a") as viewer:
            async with asyncio.timeout(WAIT):
                while len((await admin.cluster()).workers) < 2:
                    await asyncio.sleep(0.05)
            every = {(w.worker_id, w.tenant, tuple(w.job_types), w.credits, w.node_id)
                     for w in (await admin.cluster()).workers}
            assert every == {("a#w-a", "a", ("type-of-a",), 3, "secured-node"),
                             ("b#w-b", "b", ("type-of-b",), 3, "secured-node")}
            for caller in (a, viewer):
                assert [(w.worker_id, w.tenant) for w in (await caller.cluster()).workers] == [("a#w-a", "a")]
    finally:
        for worker in workers.values():
            await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT)


async def _noop(ctx: RunContext) -> None:
    return None


async def test_a_tenant_sees_and_steers_no_workflow_or_workflow_run_of_another(secured):
    node = secured
    definition = {"name": "billing", "steps": [{"name": "debit", "job_type": "t"}]}
    async with node.client("client-a") as a, node.client("client-b") as b, node.client("viewer-a") as viewer:
        theirs, _ = await b.create_workflow(definition)
        their_run = await b.trigger_workflow("billing", {"iban": "secret"})
        assert theirs.tenant == "b"
        not_found = grpc.StatusCode.NOT_FOUND
        # By name and by id, within a's own tenant: b's workflow and its run do not exist.
        await refused(a.get_workflow("billing"), not_found)
        await refused(a.trigger_workflow("billing"), not_found)
        await refused(a.list_workflow_runs("billing"), not_found)
        await refused(a.get_workflow_run(their_run.workflow_run_id), not_found)
        await refused(a.cancel_workflow_run(their_run.workflow_run_id), not_found)
        await refused(a.resume_workflow_run(their_run.workflow_run_id), not_found)
        assert (await a.list_workflow_runs(id_prefix=their_run.workflow_run_id[:8])).items == []  # nor by its start
        assert [run.workflow_run_id for run in (await b.list_workflow_runs(id_prefix=their_run.workflow_run_id[:8])).items] \
            == [their_run.workflow_run_id]
        assert (await a.list_workflows()).items == []
        # a's own workflow of the same name is another workflow, in its own tenant.
        mine, created = await a.create_workflow(definition)
        assert created and mine.tenant == "a" and mine.workflow_id != theirs.workflow_id
        async with node.client("client-a", tenant="b") as a_as_b:
            await refused(a_as_b.get_workflow_run(their_run.workflow_run_id), grpc.StatusCode.PERMISSION_DENIED)
            await refused(a_as_b.cancel_workflow_run(their_run.workflow_run_id), grpc.StatusCode.PERMISSION_DENIED)
        # A viewer reads its tenant's workflow runs but cannot steer them.
        my_run = await a.trigger_workflow("billing")
        assert (await viewer.get_workflow_run(my_run.workflow_run_id))[0].tenant == "a"
        await refused(viewer.cancel_workflow_run(my_run.workflow_run_id), grpc.StatusCode.PERMISSION_DENIED)
        await refused(viewer.trigger_workflow("billing"), grpc.StatusCode.PERMISSION_DENIED)
        assert (await b.get_workflow_run(their_run.workflow_run_id))[0].state.value == "running"


async def test_the_cluster_shows_node_addresses_to_workers_and_admins_and_shards_to_admins_only(secured):
    node = secured
    async with (node.client("admin") as admin, node.client("worker-a") as worker, node.client("viewer-a") as viewer,
                node.client("client-a") as client):
        everything = await admin.cluster()
        assert [n.address for n in everything.nodes] == [node.address]
        assert len(everything.shards) == ENGINE_SHARDS and all(s.owner for s in everything.shards)
        following = await worker.cluster()  # a worker dials the live nodes: it needs their addresses
        assert [(n.node_id, n.address, n.live) for n in following.nodes] == [("secured-node", node.address, True)]
        assert following.shards == ()
        for caller in (viewer, client):
            seen = await caller.cluster()
            assert [(n.node_id, n.address) for n in seen.nodes] == [("secured-node", "")]
            assert seen.shards == ()


async def test_a_scrape_under_auth_names_no_tenant_and_no_job_type(db_url, monkeypatch):
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)
    metrics = f"127.0.0.1:{free_port()}"
    async with secured_node(db_url, metrics_listen=metrics) as node, node.client("client-a") as a:
        await a.create("payroll", "payroll.secret-type", Schedule.now())  # no worker: it waits, unserved

        def scrape() -> str:
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as response:
                return str(response.read().decode())

        async with asyncio.timeout(WAIT):
            while "fastlane_unserved_runs{" not in (text := await asyncio.to_thread(scrape)):
                await asyncio.sleep(0.05)
        assert "payroll.secret-type" not in text and 'tenant="a"' not in text
        assert re.search(r'fastlane_unserved_runs\{job_type="j-[0-9a-f]{10}",tenant="t-[0-9a-f]{10}"\} 1\.0', text)
