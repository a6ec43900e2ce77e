"""The access check in front of every call: who is calling (a token), and may they (a role).

One gRPC server interceptor wraps each method's handler, so the check runs inside the call's own
task: it authenticates the ``authorization`` metadata (:class:`~fastlane.auth.authenticator.Authenticator`),
refuses a role the method does not allow (:mod:`fastlane.auth.roles`), and sets
:data:`~fastlane.auth.caller.current_caller` for the servicer, which scopes every read and write
to the caller's tenant. Refusals are UNAUTHENTICATED (no valid token) or PERMISSION_DENIED (a
valid token that may not do this); a token that cannot be checked because the database is down
is UNAVAILABLE, which clients retry. Lookups of token ids the node has not seen are limited per
client address (:func:`source_of`), so guessing ids from one place soon costs the database nothing.

Nothing a caller sends is read before its token is checked: a method that takes one request is
served as one that takes a stream of them (the same on the wire), so the check runs before the
first message is received, and a refused caller's payload is never read, parsed or held beyond
what the transport's flow control lets it send unasked.

A stream outlives the check made when it opened: while a worker stream is open its token is
checked again every :data:`~fastlane.auth.authenticator.CACHE_SECONDS`, and the stream is ended
with UNAUTHENTICATED once the token is revoked or expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from fastlane.auth import roles
from fastlane.auth.authenticator import CACHE_SECONDS, Authenticator
from fastlane.auth.caller import Caller, current_caller
from fastlane.domain.errors import PermissionDenied
from fastlane.errors import FastlaneError
from fastlane.rpc.status import status_of

log = logging.getLogger("fastlane.auth")

if TYPE_CHECKING:  # generic in the type stubs only
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
else:
    Handler = grpc.RpcMethodHandler


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates and authorises every call but the open ones (health)."""

    def __init__(self, authenticator: Authenticator, *, recheck_seconds: float = CACHE_SECONDS) -> None:
        self._authenticator = authenticator
        self._recheck_seconds = recheck_seconds

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method in roles.OPEN:
            return handler
        return self._wrapped(handler, method)

    async def _admit(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> Caller:
        """The caller, set for this call; aborts the call if it may not be made."""
        authorization = next((str(value) for key, value in context.invocation_metadata() or ()
                              if key == "authorization"), None)
        try:
            caller = await self._authenticator.authenticate(authorization, source=source_of(context.peer()))
            if not roles.may_call(caller.role, method):
                raise PermissionDenied(f"a {caller.role} token may not call {method.rsplit('/', 1)[-1]}")
        except FastlaneError as error:
            log.info("refused %s: %s", method, error)
            await context.abort(status_of(error), str(error))
            raise AssertionError("unreachable: context.abort raises") from error
        current_caller.set(caller)  # this call runs in its own task: the value ends with it
        return caller

    def _wrapped(self, handler: Handler, method: str) -> Handler:
        admit = self._admit
        if handler.unary_unary is not None:
            unary: Callable[..., Any] = handler.unary_unary  # async under grpc.aio, whatever the stubs say

            async def unary_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await admit(method, context)
                return await unary(await _only_request(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(
                _as_behaviour(unary_unary), request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, method), request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(handler.stream_stream, method, streamed=True),
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        if handler.stream_unary is not None:
            stream_unary: Callable[..., Any] = handler.stream_unary

            async def client_streaming(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await admit(method, context)
                return await stream_unary(requests, context)

            return grpc.stream_unary_rpc_method_handler(
                _as_behaviour(client_streaming), request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler

    def _streaming(self, behaviour: Callable[..., Any], method: str, *, streamed: bool = False) -> Callable[..., Any]:
        """A server-streaming behaviour behind the check: an async generator (reflection) or a
        coroutine that writes with ``context.write`` (the worker stream), re-checked while open.
        Served with a stream of requests either way; ``streamed`` says the method takes one, else
        its one request is read after the check and handed on alone."""
        admit, recheck = self._admit, self._watch_token

        async def request_of(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return requests if streamed else await _only_request(requests, context)

        if inspect.isasyncgenfunction(behaviour):
            async def generator(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                await admit(method, context)
                async for response in behaviour(await request_of(requests, context), context):
                    yield response

            return generator

        async def coroutine(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            caller = await admit(method, context)
            serving = asyncio.ensure_future(behaviour(await request_of(requests, context), context))
            watching = asyncio.ensure_future(recheck(caller, serving))
            try:
                return await serving
            except asyncio.CancelledError:
                if not watching.done() or watching.cancelled() or (refusal := watching.result()) is None:
                    raise
                log.warning("ended a %s stream of token %s: %s", method.rsplit("/", 1)[-1], caller.token_id, refusal)
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)
            finally:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching
                if not serving.done():
                    serving.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await serving

        return coroutine

    async def _watch_token(self, caller: Caller, serving: asyncio.Future[Any]) -> str | None:
        """Check the stream's token every few seconds; cancel ``serving`` and return why once it
        may no longer be used."""
        while not serving.done():
            await asyncio.sleep(self._recheck_seconds)
            refusal = await self._authenticator.still_valid(caller)
            if refusal is not None:
                serving.cancel()
                return refusal
        return None


async def _only_request(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    """The one request of a unary method, read once the caller is admitted."""
    async for request in requests:
        return request
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request")
    raise AssertionError("unreachable: context.abort raises")


def source_of(peer: str | None) -> str:
    """Where a call comes from, for limits per source: the client's host without its port
    (``ipv4:10.0.0.7:51234`` is ``ipv4:10.0.0.7``; each connection has a port of its own), or the
    whole peer for a Unix socket."""
    peer = peer or ""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rpartition(":")[0]
    return peer


def _as_behaviour(behaviour: Callable[..., Any]) -> Any:
    """``behaviour`` as grpc's handler factories take it: their stubs describe the synchronous
    server's signature, and an async behaviour is what ``grpc.aio`` calls."""
    return behaviour
