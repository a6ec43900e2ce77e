"""What a caller without a token can make a node hold: one message of the largest valid request per
call in flight. A larger message is refused by the transport before the token is checked."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from fastlane._proto import common_pb2 as pb
from fastlane._proto import jobs_pb2, jobs_pb2_grpc
from fastlane.auth.authenticator import Authenticator
from fastlane.server.grpc_server import MESSAGE_ENVELOPE_BYTES, max_message_bytes
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.testing.processes import free_port

MAX_PAYLOAD = 200_000  # under the checkpoint limit: the bound is the checkpoint's (1 MiB) + the envelope


def create(payload_bytes: int) -> jobs_pb2.CreateJobRequest:
    return jobs_pb2.CreateJobRequest(spec=pb.JobSpec(name="big", job_type="t", schedule=pb.Schedule(now=pb.Now()),
                                                     payload=b"p" * payload_bytes))


async def test_a_request_over_the_bound_is_refused_before_any_token_is_checked(tmp_path, monkeypatch):
    checked = 0
    authenticate = Authenticator.authenticate

    async def counted(self: Authenticator, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal checked
        checked += 1
        return await authenticate(self, *args, **kwargs)

    monkeypatch.setattr(Authenticator, "authenticate", counted)
    settings = Settings(db_url=f"sqlite:///{tmp_path}/node.db", listen=f"127.0.0.1:{free_port()}", node_id="node-a",
                        shard_count=4, auth=True, max_payload_bytes=MAX_PAYLOAD)
    node = Node(settings)
    task = asyncio.create_task(node.run())
    try:
        await asyncio.wait_for(node.ready.wait(), 20)
        bound = max_message_bytes(MAX_PAYLOAD)
        async with grpc.aio.insecure_channel(settings.listen, options=[
                ("grpc.max_send_message_length", 64 << 20)]) as channel:
            jobs = jobs_pb2_grpc.JobServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await jobs.CreateJob(create(bound + 1), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
            assert checked == 0, "the token was checked for a message over the bound"
            # Within the bound, the call reaches the access check (and is refused there).
            with pytest.raises(grpc.aio.AioRpcError) as unauthenticated:
                await jobs.CreateJob(create(bound - MESSAGE_ENVELOPE_BYTES), timeout=10)
            assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert checked == 1
    finally:
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
