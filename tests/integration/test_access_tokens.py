"""A node with ``--auth``: every call needs a valid token, and its role decides what it may call.

Real node, real gRPC, both backends; tokens are made in the node's database as an operator would
(``fastlane tokens create --db``) and through the API by an admin.
"""

from __future__ import annotations

import asyncio
import random
import string
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastlane._proto import admin_pb2, admin_pb2_grpc, common_pb2, jobs_pb2, jobs_pb2_grpc, runs_pb2, runs_pb2_grpc
from fastlane.auth import roles
from fastlane.domain.access import Role
from fastlane.domain.models import Schedule
from fastlane.errors import InvalidArgument, RemoteError
from fastlane.rpc.channel import open_channel
from fastlane.server.grpc_server import SERVICE_NAMES

WAIT = 15.0


async def status_of_call(call: Awaitable[Any]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def every_call(channel: grpc.aio.Channel) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One call of every API method, with a request that is valid enough to pass validation."""
    jobs, runs = jobs_pb2_grpc.JobServiceStub(channel), runs_pb2_grpc.RunServiceStub(channel)
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    spec = common_pb2.JobSpec(name="matrix", job_type="t", schedule=common_pb2.Schedule(now=common_pb2.Now()))
    return {
        "/fastlane.v1.JobService/CreateJob": lambda: jobs.CreateJob(jobs_pb2.CreateJobRequest(spec=spec), timeout=WAIT),
        "/fastlane.v1.JobService/GetJob": lambda: jobs.GetJob(jobs_pb2.GetJobRequest(job_id="no-such-job"), timeout=WAIT),
        "/fastlane.v1.JobService/ListJobs": lambda: jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=WAIT),
        "/fastlane.v1.JobService/UpdateJob": lambda: jobs.UpdateJob(
            jobs_pb2.UpdateJobRequest(job_id="no-such-job", spec=spec), timeout=WAIT),
        "/fastlane.v1.JobService/PauseJob": lambda: jobs.PauseJob(jobs_pb2.PauseJobRequest(job_id="no-such-job"), timeout=WAIT),
        "/fastlane.v1.JobService/ResumeJob": lambda: jobs.ResumeJob(jobs_pb2.ResumeJobRequest(job_id="no-such-job"), timeout=WAIT),
        "/fastlane.v1.JobService/DeleteJob": lambda: jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id="no-such-job"), timeout=WAIT),
        "/fastlane.v1.JobService/TriggerJob": lambda: jobs.TriggerJob(jobs_pb2.TriggerJobRequest(job_id="no-such-job"), timeout=WAIT),
        "/fastlane.v1.JobService/PreviewSchedule": lambda: jobs.PreviewSchedule(jobs_pb2.PreviewScheduleRequest(
            schedule=common_pb2.Schedule(cron=common_pb2.Cron(expression="0 * * * *"))), timeout=WAIT),
        "/fastlane.v1.RunService/ListRuns": lambda: runs.ListRuns(runs_pb2.ListRunsRequest(), timeout=WAIT),
        "/fastlane.v1.RunService/GetRun": lambda: runs.GetRun(runs_pb2.GetRunRequest(run_id="no-such-run"), timeout=WAIT),
        "/fastlane.v1.RunService/CancelRun": lambda: runs.CancelRun(runs_pb2.CancelRunRequest(run_id="no-such-run"), timeout=WAIT),
        "/fastlane.v1.RunService/RetryRun": lambda: runs.RetryRun(runs_pb2.RetryRunRequest(run_id="no-such-run"), timeout=WAIT),
        "/fastlane.v1.AdminService/GetCluster": lambda: admin.GetCluster(admin_pb2.GetClusterRequest(), timeout=WAIT),
        "/fastlane.v1.AdminService/CreateToken": lambda: admin.CreateToken(
            admin_pb2.CreateTokenRequest(tenant="a", role=admin_pb2.ROLE_VIEWER, name="matrix"), timeout=WAIT),
        "/fastlane.v1.AdminService/ListTokens": lambda: admin.ListTokens(admin_pb2.ListTokensRequest(), timeout=WAIT),
        "/fastlane.v1.AdminService/RevokeToken": lambda: admin.RevokeToken(
            admin_pb2.RevokeTokenRequest(token_id="nosuchtoken0"), timeout=WAIT),
        "/fastlane.v1.AdminService/GetQuota": lambda: admin.GetQuota(admin_pb2.GetQuotaRequest(), timeout=WAIT),
        "/fastlane.v1.AdminService/SetQuota": lambda: admin.SetQuota(
            admin_pb2.SetQuotaRequest(tenant="a", reset=True), timeout=WAIT),
        "/fastlane.v1.JobService/ListAudit": lambda: jobs.ListAudit(
            jobs_pb2.ListAuditRequest(target_kind=jobs_pb2.AUDIT_TARGET_JOB, target_id="no-such-job"), timeout=WAIT),
    }


def test_every_served_method_has_a_line_in_the_role_table():
    # Deny by default means a method without a line is closed to everyone: a new RPC must be given one.
    from fastlane._proto import admin_pb2 as admin
    from fastlane._proto import jobs_pb2 as jobs
    from fastlane._proto import runs_pb2 as runs
    from fastlane._proto import workers_pb2 as workers

    served = set()
    for module in (admin, jobs, runs, workers):
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.full_name in SERVICE_NAMES
            served |= {f"/{service.full_name}/{method.name}" for method in service.methods}
    assert served <= set(roles.ALLOWED)
    assert not served & roles.OPEN


async def test_a_call_without_a_valid_token_is_unauthenticated_and_health_stays_open(secured):
    node = secured
    expired = await node.issue("expired", "a", Role.CLIENT, expires_in=timedelta(seconds=1))
    revoked = await node.issue("revoked", "a", Role.CLIENT)
    await node.store.tokens.revoke_token(node.tokens["revoked"].token_id)
    real = node.secrets["client-a"]
    wrong_secret = real[:-4] + ("0000" if not real.endswith("0000") else "1111")
    presented = {
        "none": None,
        "not a fastlane token": "hello",
        "unknown id": "fl_zzzzzzzzzzzz_" + "0" * 64,
        "wrong secret": wrong_secret,
        "revoked": revoked,
    }
    async with asyncio.timeout(WAIT):  # the expired one: its second passes meanwhile
        while time.time() < node.tokens["expired"].expires_at.timestamp() + 0.05:
            await asyncio.sleep(0.05)
    presented["expired"] = expired
    for what, token in presented.items():
        channel = open_channel(node.address, token=token)
        try:
            code = await status_of_call(jobs_pb2_grpc.JobServiceStub(channel).ListJobs(jobs_pb2.ListJobsRequest(),
                                                                                        timeout=WAIT))
            assert code is grpc.StatusCode.UNAUTHENTICATED, what
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
            assert health.status == health_pb2.HealthCheckResponse.SERVING, what
        finally:
            await channel.close()


async def test_each_role_may_make_exactly_the_calls_the_table_allows(secured):
    node = secured
    for who, role in (("admin", Role.ADMIN), ("client-a", Role.CLIENT), ("viewer-a", Role.VIEWER),
                      ("worker-a", Role.WORKER)):
        channel = open_channel(node.address, token=node.secrets[who])
        try:
            for method, call in every_call(channel).items():
                code = await status_of_call(call())
                assert code is not grpc.StatusCode.UNAUTHENTICATED, (who, method)
                if roles.may_call(role, method):
                    assert code is not grpc.StatusCode.PERMISSION_DENIED, (who, method)
                else:
                    assert code is grpc.StatusCode.PERMISSION_DENIED, (who, method)
        finally:
            await channel.close()


async def test_an_admin_makes_lists_and_revokes_tokens_through_the_api(secured):
    node = secured
    async with node.client("admin") as admin:
        token, secret = await admin.create_token("c", Role.CLIENT, name="ci", expires_in=timedelta(days=30))
        assert (token.tenant, token.role, token.name) == ("c", Role.CLIENT, "ci")
        assert token.expires_at is not None
        assert abs(token.expires_at - token.created_at - timedelta(days=30)) < timedelta(seconds=5)
        assert secret.startswith(f"fl_{token.token_id}_")

        async with node.client(None, token=secret) as newcomer:  # usable at once, in its own tenant
            job = await newcomer.create("first", "t", Schedule.interval(timedelta(hours=1)))
            assert job.tenant == "c"

        listed = {t.token_id: t for t in await admin.list_tokens("c")}
        assert set(listed) == {token.token_id}
        assert all(t.tenant == "a" for t in await admin.list_tokens("a"))
        assert len(await admin.list_tokens()) == len(node.tokens) + 1

        revoked = await admin.revoke_token(token.token_id)
        assert revoked.revoked_at is not None
        again = await admin.revoke_token(token.token_id)  # not an error; the first time stays
        assert again.revoked_at == revoked.revoked_at
        with pytest.raises(RemoteError) as unknown:
            await admin.revoke_token("nosuchtoken0")
        assert unknown.value.code is grpc.StatusCode.NOT_FOUND
        with pytest.raises(InvalidArgument, match="role"):  # the client knows the roles: refused before sending
            await admin.create_token("c", "owner")
    channel = open_channel(node.address, token=node.secrets["admin"])
    try:  # and a role number the node does not know (a newer client's, or garbage) is refused by it
        code = await status_of_call(admin_pb2_grpc.AdminServiceStub(channel).CreateToken(
            admin_pb2.CreateTokenRequest(tenant="c", role=99), timeout=WAIT))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await channel.close()


async def test_a_revoked_token_stops_working_within_seconds(secured):
    node = secured
    async with node.client("client-a") as client, node.client("admin") as admin:
        await client.list_jobs()  # works, and is now cached by the node
        await admin.revoke_token(node.tokens["client-a"].token_id)
        revoked_at = time.monotonic()
        async with asyncio.timeout(WAIT):
            while True:
                try:
                    await client.list_jobs()
                except RemoteError as error:
                    assert error.code is grpc.StatusCode.UNAUTHENTICATED
                    break
                await asyncio.sleep(0.05)
        took = time.monotonic() - revoked_at
    print(f"revoked token refused after {took:.2f} s")


async def test_last_use_is_recorded(secured):
    node = secured
    async with node.client("viewer-a") as viewer:
        await viewer.list_jobs()
    assert node.node.authenticator is not None
    await node.node.authenticator.flush_last_used()
    token = next(t for t in await node.store.tokens.list_tokens("a") if t.token_id == node.tokens["viewer-a"].token_id)
    assert token.last_used_at is not None and token.last_used_at >= token.created_at


async def test_random_authorization_values_are_unauthenticated_never_an_error(secured):
    # The one new input of S2 on every call: whatever it holds, the answer is UNAUTHENTICATED.
    rng = random.Random(20261123)
    real = secured.secrets["client-a"]
    values = ["", "Bearer", "Bearer ", "bearer " + real.upper(), "Basic " + real, real, "Bearer  " + real + "x",
              "Bearer " + real[:-1], "Bearer fl__" + "0" * 64, "Bearer " + "fl_" + "a" * 12 + "_" + "g" * 64,
              "Bearer " + "x" * 4000]
    alphabet = string.ascii_letters + string.digits + string.punctuation + " "
    values += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300))) for _ in range(200)]
    values += ["Bearer " + real[:rng.randint(0, len(real))] + "".join(rng.choice(alphabet) for _ in range(5))
               for _ in range(50)]
    channel = open_channel(secured.address)
    stub = jobs_pb2_grpc.JobServiceStub(channel)
    try:
        for value in values:
            code = await status_of_call(stub.ListJobs(jobs_pb2.ListJobsRequest(), timeout=WAIT,
                                                      metadata=(("authorization", value),)))
            assert code is grpc.StatusCode.UNAUTHENTICATED, value
    finally:
        await channel.close()
