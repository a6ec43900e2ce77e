"""The access check runs before a call's request is read: a caller without a valid token never has
its message parsed, whatever the method's kind, so what it sends costs the node no more than the
transport holds for a call nobody reads."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from fastlane.auth.caller import Caller
from fastlane.auth.roles import Role
from fastlane.domain.errors import Unauthenticated
from fastlane.server.access import AccessInterceptor

UNARY = "/fastlane.v1.JobService/GetJob"  # readable by a client: the role check lets it through
SERVER_STREAMING = "/fastlane.v1.RunService/ListRuns"  # served here as a server stream, to test that kind
GOOD = "Bearer good"


class Tokens:
    """Admits one token; counts the checks."""

    def __init__(self) -> None:
        self.checked = 0

    async def authenticate(self, authorization: str | None, *, source: str) -> Caller:
        self.checked += 1
        if authorization != GOOD:
            raise Unauthenticated("no valid token")
        return Caller(token_id="t1", name="test", tenant="acme", role=Role.CLIENT)


class Parsed:
    """A request deserializer that counts what it parsed."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    def __call__(self, data: bytes) -> bytes:
        self.messages.append(data)
        return data


class Methods(grpc.GenericRpcHandler):
    def __init__(self, parsed: Parsed) -> None:
        async def echo(request: bytes, context: Any) -> bytes:
            return b"got " + request[:4]

        async def stream(request: bytes, context: Any) -> Any:
            yield b"got " + request[:4]

        self._handlers = {
            UNARY: grpc.unary_unary_rpc_method_handler(echo, request_deserializer=parsed),
            SERVER_STREAMING: grpc.unary_stream_rpc_method_handler(stream, request_deserializer=parsed),
        }

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self._handlers.get(handler_call_details.method)


@pytest.fixture
async def server():
    tokens, parsed = Tokens(), Parsed()
    server = grpc.aio.server(interceptors=[AccessInterceptor(tokens)])  # type: ignore[arg-type]
    server.add_generic_rpc_handlers([Methods(parsed)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", tokens, parsed
    finally:
        await server.stop(None)


@pytest.mark.parametrize("method", [UNARY, SERVER_STREAMING])
async def test_a_refused_caller_never_has_its_request_read(server, method: str) -> None:
    address, tokens, parsed = server
    payload = b"x" * (512 << 10)
    async with grpc.aio.insecure_channel(address) as channel:
        call = (channel.unary_unary if method == UNARY else channel.unary_stream)(method)
        for metadata in ((), (("authorization", "Bearer forged"),)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                reply = call(payload, metadata=metadata, timeout=10)
                if method == UNARY:
                    await reply
                else:
                    async for _ in reply:
                        pass
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert tokens.checked == 2
        assert parsed.messages == [], "a request was parsed before its caller was admitted"


@pytest.mark.parametrize("method", [UNARY, SERVER_STREAMING])
async def test_an_admitted_caller_gets_its_one_request_handled(server, method: str) -> None:
    address, tokens, parsed = server
    async with grpc.aio.insecure_channel(address) as channel:
        if method == UNARY:
            replies = [await channel.unary_unary(method)(b"ping", metadata=(("authorization", GOOD),), timeout=10)]
        else:
            replies = [reply async for reply in channel.unary_stream(method)(
                b"ping", metadata=(("authorization", GOOD),), timeout=10)]
    assert replies == [b"got ping"]
    assert parsed.messages == [b"ping"] and tokens.checked == 1
