"""What a caller can make a node hold before its token is checked: nothing of its request. The
check runs before the first message is read (see ``test_access_reads_nothing_first``), so a caller
without a valid token is refused whatever it sends; an admitted caller's message is still bounded
by the transport at the largest valid request."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from fastlane._proto import common_pb2 as pb
from fastlane._proto import jobs_pb2, jobs_pb2_grpc
from fastlane.auth.authenticator import Authenticator
from fastlane.auth.issuing import issue_token
from fastlane.domain.access import Role
from fastlane.server.grpc_server import MESSAGE_ENVELOPE_BYTES, max_message_bytes
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.storage import open_store
from fastlane.testing.processes import free_port

MAX_PAYLOAD = 200_000  # under the checkpoint limit: the bound is the checkpoint's (1 MiB) + the envelope
SHARDS = 4


def create(payload_bytes: int) -> jobs_pb2.CreateJobRequest:
    return jobs_pb2.CreateJobRequest(spec=pb.JobSpec(name="big", job_type="t", schedule=pb.Schedule(now=pb.Now()),
                                                     payload=b"p" * payload_bytes))


async def test_no_token_is_refused_before_the_request_and_a_token_meets_the_transport_bound(tmp_path, monkeypatch):
    checked = 0
    authenticate = Authenticator.authenticate

    async def counted(self: Authenticator, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal checked
        checked += 1
        return await authenticate(self, *args, **kwargs)

    monkeypatch.setattr(Authenticator, "authenticate", counted)
    db_url = f"sqlite:///{tmp_path}/node.db"
    settings = Settings(db_url=db_url, listen=f"127.0.0.1:{free_port()}", node_id="node-a",
                        shard_count=SHARDS, auth=True, max_payload_bytes=MAX_PAYLOAD)
    node = Node(settings)
    task = asyncio.create_task(node.run())
    store = open_store(db_url, shard_count=SHARDS)
    try:
        await asyncio.wait_for(node.ready.wait(), 20)
        _, secret = await issue_token(store, tenant="a", role=Role.CLIENT, name="client")
        bound = max_message_bytes(MAX_PAYLOAD)
        async with grpc.aio.insecure_channel(settings.listen, options=[
                ("grpc.max_send_message_length", 64 << 20)]) as channel:
            jobs = jobs_pb2_grpc.JobServiceStub(channel)
            # Without a token, a message over the bound is refused by the check, unread.
            with pytest.raises(grpc.aio.AioRpcError) as unauthenticated:
                await jobs.CreateJob(create(bound + 1), timeout=10)
            assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert checked == 1
            # With one, the transport refuses a message over the bound, and takes one within it.
            token = (("authorization", f"Bearer {secret}"),)
            with pytest.raises(grpc.aio.AioRpcError) as too_large:
                await jobs.CreateJob(create(bound + 1), metadata=token, timeout=10)
            assert too_large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, too_large.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as within:
                await jobs.CreateJob(create(bound - MESSAGE_ENVELOPE_BYTES), metadata=token, timeout=10)
            # Read and validated: over --max-payload-bytes, so refused by the payload rule.
            assert within.value.code() == grpc.StatusCode.INVALID_ARGUMENT, within.value.details()
    finally:
        await store.close()
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
