"""The audit trail through a real node: who created, changed, triggered, cancelled or retried
what and when, as ``ListAudit`` (``Client.list_audit``) and ``jobs get`` / ``runs get`` show it.

Real node, real gRPC, both backends: with ``--auth`` (the ``secured`` fixture's tokens) and
without (a plain node, where events carry no token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import grpc
import orjson
import pytest

from fastlane._proto import jobs_pb2, jobs_pb2_grpc
from fastlane.cli.main import main
from fastlane.client import Client
from fastlane.domain.audit import AuditEvent, AuditTarget
from fastlane.domain.errors import StorageUnavailable
from fastlane.domain.models import AttemptOutcome, RetryPolicy, RunState, Schedule
from fastlane.errors import RemoteError
from fastlane.rpc.channel import open_channel
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.storage import AttemptResult, Dispatch
from fastlane.storage.store.records import SQLAudit
from fastlane.testing.processes import free_port

HOURLY = Schedule.interval(timedelta(hours=1))
WAIT = 15.0


def trail(events: list[AuditEvent]) -> list[tuple[str, str, str]]:
    return [(e.action.value, e.target_kind.value, e.target_id) for e in events]


def assert_newest_first(events: list[AuditEvent]) -> None:
    keys = [(e.at, e.event_id) for e in events]
    assert keys == sorted(keys, reverse=True)


# -- with --auth: the token that made each change ------------------------------------------------


async def test_each_change_through_a_client_token_is_in_the_trail_with_its_id_and_name(secured):
    me = secured.tokens["client-a"]
    async with secured.client("client-a") as client:
        job = await client.create("audited", "t", HOURLY)
        await client.create("audited", "t", HOURLY)  # exists with this spec: nothing changed, nothing recorded
        await client.update_job(job.job_id, replace(job.spec, priority=5))
        await client.pause_job(job.job_id)
        await client.resume_job(job.job_id)
        run = await client.trigger_job(job.job_id)
        cancelled = await client.cancel_run(run.run_id)
        await client.delete_job(job.job_id)

        history = await client.list_audit("job", job.job_id)
        run_history = await client.list_audit(AuditTarget.RUN, run.run_id)
        newest_two = await client.list_audit("job", job.job_id, limit=2)

    assert cancelled.state is RunState.CANCELLED
    assert trail(history) == [
        ("deleted", "job", job.job_id),
        ("cancelled", "run", run.run_id),
        ("triggered", "run", run.run_id),
        ("resumed", "job", job.job_id),
        ("paused", "job", job.job_id),
        ("updated", "job", job.job_id),
        ("created", "job", job.job_id),
    ]
    assert all((e.token_id, e.actor, e.tenant, e.job_id) == (me.token_id, "client-a", "a", job.job_id) for e in history)
    assert_newest_first(history)
    assert (history[-1].detail, history[-2].detail) == ("audited", "version 2")
    assert trail(run_history) == [("cancelled", "run", run.run_id), ("triggered", "run", run.run_id)]
    assert newest_two == history[:2]


async def test_a_retry_is_recorded_against_the_run(secured):
    async with secured.client("client-a") as client:
        job = await client.create("fragile", "t", HOURLY, retry=RetryPolicy(max_attempts=1))
        run = await client.trigger_job(job.job_id)
        # No worker is connected: the run dies as a worker's permanent failure would leave it.
        await secured.store.attempts.record_dispatches([Dispatch(run_id=run.run_id, lease_token=1, worker_id="w", node_id="n",
                                                        lease_ttl=timedelta(seconds=30), dispatched_at=run.created_at)])
        [outcome] = await secured.store.attempts.record_results(
            [AttemptResult(run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.PERMANENT_FAILURE)])
        assert outcome.run.state is RunState.DEAD
        await client.retry_run(run.run_id)

        history = await client.list_audit("run", run.run_id)

    assert trail(history) == [("retried", "run", run.run_id), ("triggered", "run", run.run_id)]
    assert history[0].detail == "attempt 2"
    assert {e.token_id for e in history} == {secured.tokens["client-a"].token_id}


async def test_another_tenant_sees_nothing_of_a_jobs_trail_and_may_not_name_its_tenant(secured):
    async with secured.client("client-a") as client:
        job = await client.create("private", "t", HOURLY)
        run = await client.trigger_job(job.job_id)
    async with secured.client("client-b") as other:
        assert await other.list_audit("job", job.job_id) == []
        assert await other.list_audit("run", run.run_id) == []
        # b's own changes go to b's trail only.
        mine = await other.create("private", "t", HOURLY)
        assert trail(await other.list_audit("job", mine.job_id)) == [("created", "job", mine.job_id)]
    async with secured.client("client-b", tenant="a") as other_as_a:
        with pytest.raises(RemoteError) as refused:
            await other_as_a.list_audit("job", job.job_id)
        assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED

    # Readers of tenant a, and an admin naming it, see it; a worker token may not read it.
    expected = [("triggered", "run", run.run_id), ("created", "job", job.job_id)]
    async with secured.client("viewer-a") as viewer, secured.client("admin", tenant="a") as admin:
        assert trail(await viewer.list_audit("job", job.job_id)) == expected
        assert trail(await admin.list_audit("job", job.job_id)) == expected
    async with secured.client("admin") as admin_of_ops:
        assert await admin_of_ops.list_audit("job", job.job_id) == []  # its own tenant, ops
    async with secured.client("worker-a") as worker:
        with pytest.raises(RemoteError) as refused:
            await worker.list_audit("job", job.job_id)
        assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    # main() runs its own event loop, so it runs in a thread while this loop serves the node.
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_jobs_get_and_runs_get_show_the_history(secured, capsys, monkeypatch):
    me = secured.tokens["client-a"]
    async with secured.client("client-a") as client:
        job = await client.create("shown", "t", HOURLY)
        await client.pause_job(job.job_id)
        run = await client.trigger_job(job.job_id)
    monkeypatch.setenv("FASTLANE_TOKEN", secured.secrets["client-a"])
    remote = ("--server", secured.address)

    code, out, err = await run_cli(capsys, "jobs", "get", job.job_id, *remote)
    assert (code, err) == (0, "")
    fields, history = out.split("\nhistory\n")
    assert fields.splitlines()[0].split() == ["job_id", job.job_id]
    header, *rows = history.splitlines()
    assert header.split() == ["WHEN", "ACTION", "ACTOR", "TARGET", "DETAIL"]
    assert [row.split()[1] for row in rows] == ["triggered", "paused", "created"]
    assert all(f"client-a ({me.token_id})" in row for row in rows)
    assert f"run {run.run_id}" in rows[0] and rows[2].rstrip().endswith("shown")

    code, out, _ = await run_cli(capsys, "jobs", "get", job.job_id, "--json", *remote)
    shown = orjson.loads(out)
    assert code == 0 and shown["job_id"] == job.job_id
    assert [(e["action"], e["token_id"], e["actor"]) for e in shown["history"]] == [
        ("triggered", me.token_id, "client-a"), ("paused", me.token_id, "client-a"), ("created", me.token_id, "client-a")]
    assert shown["history"][0]["target_kind"] == "run" and shown["history"][0]["target_id"] == run.run_id

    code, out, _ = await run_cli(capsys, "runs", "get", run.run_id, *remote)
    header, *rows = out.split("\nhistory\n")[1].splitlines()
    assert header.split() == ["WHEN", "ACTION", "ACTOR", "DETAIL"]
    assert [row.split()[1] for row in rows] == ["triggered"]

    code, out, _ = await run_cli(capsys, "runs", "get", run.run_id, "--json", *remote)
    assert [e["action"] for e in orjson.loads(out)["history"]] == ["triggered"]


# -- without authentication ----------------------------------------------------------------------


@pytest.fixture
async def plain(db_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """The address of a running in-process node without authentication, on either backend."""
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)
    address = f"127.0.0.1:{free_port()}"
    node = Node(Settings(db_url=db_url, listen=address, node_id="plain-node", shard_count=4))
    task = asyncio.create_task(node.run(), name="plain-node")
    try:
        async with asyncio.timeout(30):
            while not node.ready.is_set():
                if task.done():
                    await task  # raises why it stopped
                await asyncio.sleep(0.02)
        yield address
    finally:
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def test_without_authentication_events_carry_no_token(plain, capsys):
    async with Client(plain, timeout=WAIT) as client:
        job = await client.create("open", "t", HOURLY)
        run = await client.trigger_job(job.job_id)
        await client.cancel_run(run.run_id)
        history = await client.list_audit("job", job.job_id)

    assert trail(history) == [("cancelled", "run", run.run_id), ("triggered", "run", run.run_id),
                              ("created", "job", job.job_id)]
    assert {(e.token_id, e.actor, e.tenant) for e in history} == {(None, "", "default")}

    code, out, _ = await run_cli(capsys, "jobs", "get", job.job_id, "--server", plain)
    assert code == 0
    assert out.count("unauthenticated (auth off)") == 3


async def test_an_audit_write_that_fails_does_not_fail_the_change(plain, monkeypatch, caplog):
    # The change is committed before its event is written: the caller hears it succeeded, and the
    # gap is logged with the whole event.
    async def unavailable(self: object, events: object) -> None:
        raise StorageUnavailable("the database went away (test)")

    async with Client(plain, timeout=WAIT) as client:
        with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="fastlane.audit"):
            patch.setattr(SQLAudit, "record_audit", unavailable)
            job = await client.create("unrecorded", "t", HOURLY)
            paused = await client.pause_job(job.job_id)
        assert await client.list_audit("job", job.job_id) == []

    assert paused.state.value == "paused"
    warnings = [record.getMessage() for record in caplog.records if record.name == "fastlane.audit"]
    assert len(warnings) == 2
    assert all("audit event not recorded" in w and job.job_id in w for w in warnings)
    assert "action=<AuditAction.CREATED: 'created'>" in warnings[0]


# -- bounds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "named"), [
    ({"limit": -1}, "limit"),
    ({"limit": 1001}, "limit"),
    ({"limit": 2**31 - 1}, "limit"),
    ({"target_kind": jobs_pb2.AUDIT_TARGET_UNSPECIFIED}, "target_kind"),
    ({"target_kind": 3}, "target_kind"),  # a value past the enumeration's (a newer client's)
    ({"target_kind": -1}, "target_kind"),
    ({"target_kind": 2**31 - 1}, "target_kind"),
    ({"target_id": ""}, "target_id"),
    ({"target_id": "x" * 201}, "target_id"),
    ({"target_id": "x" * 1_000_000}, "target_id"),
    ({"target_id": "a\x00b"}, "target_id"),
    ({"tenant": "not a tenant!"}, "tenant"),
    ({"tenant": "t" * 100_000}, "tenant"),
])
async def test_list_audit_refuses_out_of_range_requests_naming_the_field(plain, fields, named):
    request = jobs_pb2.ListAuditRequest(**({"target_kind": jobs_pb2.AUDIT_TARGET_JOB, "target_id": "some-job"} | fields))
    channel = open_channel(plain, token=None)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await jobs_pb2_grpc.JobServiceStub(channel).ListAudit(request, timeout=WAIT)
    finally:
        await channel.close()
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert named in (refused.value.details() or "")


async def test_list_audit_answers_random_requests_with_ok_or_invalid_argument(plain):
    # A seeded sweep in the style of tests/fuzz: every answer is OK or INVALID_ARGUMENT naming a
    # field, never INTERNAL or UNKNOWN, and the node serves on.
    rng = random.Random(20261123)
    texts = ["", "job", "run", "x" * 200, "x" * 201, "é" * 50, "a\x00b", "a\nb", "default", "ok-id", "\U0001f600"]
    named = ("tenant", "target_kind", "target_id", "limit")
    channel = open_channel(plain, token=None)
    stub = jobs_pb2_grpc.JobServiceStub(channel)
    answers: dict[str, int] = {}
    try:
        for _ in range(300):
            request = jobs_pb2.ListAuditRequest(
                tenant=rng.choice(texts), target_kind=rng.choice([0, 1, 2, 3, -1, 2**31 - 1]), target_id=rng.choice(texts),
                limit=rng.choice([0, 1, 50, 1000, 1001, -1, -(2**31), 2**31 - 1, rng.randint(-5, 2000)]))
            try:
                await stub.ListAudit(request, timeout=WAIT)
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                code = error.code()
                assert code is grpc.StatusCode.INVALID_ARGUMENT, (request, error.details())
                assert any(field in (error.details() or "") for field in named), (request, error.details())
            answers[code.name] = answers.get(code.name, 0) + 1
        valid = jobs_pb2.ListAuditRequest(target_kind=jobs_pb2.AUDIT_TARGET_JOB, target_id="ok-id", limit=1000)
        assert list((await stub.ListAudit(valid, timeout=WAIT)).events) == []
    finally:
        await channel.close()
    assert answers.get("OK", 0) > 0 and answers.get("INVALID_ARGUMENT", 0) > 0
