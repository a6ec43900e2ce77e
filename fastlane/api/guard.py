"""Turn fastlane errors raised inside a servicer method into gRPC statuses with their message."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from fastlane.api.status import status_of
from fastlane.errors import FastlaneError

log = logging.getLogger("fastlane.api")
R = TypeVar("R")


def rpc(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Decorate a unary servicer method: expected errors become statuses, others INTERNAL."""

    @functools.wraps(method)
    async def guarded(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await method(self, request, context)
        except FastlaneError as error:
            await context.abort(status_of(error), str(error))
        except (ValueError, TypeError) as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        raise AssertionError("unreachable: context.abort raises")

    return guarded


def tenant_of(requested: str) -> str:
    """The tenant a call acts for. Without authentication, the one the caller names."""
    return requested or "default"
