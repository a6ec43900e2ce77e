"""Turn errors raised inside a servicer method into gRPC statuses with their message.

Expected errors (:class:`FastlaneError`) become the status of the one table in ``status``. Any
other exception is a bug: the caller gets INTERNAL with an error id, the log gets the traceback
under the same id, and the node goes on. UNKNOWN (what grpc answers for an escaped exception) is
never returned.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from fastlane.auth.caller import acting_tenant
from fastlane.domain.errors import new_error_id
from fastlane.errors import FastlaneError
from fastlane.rpc.status import status_of

log = logging.getLogger("fastlane.api")
S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def rpc(
    method: Callable[[S, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]],
) -> Callable[[S, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]]:
    """Decorate a unary servicer method: expected errors become statuses, others INTERNAL."""

    @functools.wraps(method)
    async def guarded(self: S, request: Req, context: grpc.aio.ServicerContext[Req, Resp]) -> Resp:
        try:
            return await method(self, request, context)
        except FastlaneError as error:
            await context.abort(status_of(error), str(error))
        except Exception:
            error_id = new_error_id()
            log.exception("%s failed unexpectedly (error id %s)", method.__name__, error_id)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error {error_id}: see the node's log")
        raise AssertionError("unreachable: context.abort raises")

    return guarded


def tenant_of(requested: str) -> str:
    """The tenant a call acts for: the caller's token's, or the one the request names (which
    only an admin token may choose freely); without authentication, the one named."""
    return acting_tenant(requested)
