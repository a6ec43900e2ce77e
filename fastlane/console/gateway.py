"""The console's way into the node: the API's own servicers, called in process as the signed-in caller.

Every page and action of the console is a call of a gRPC method, made here without the network:
the same role table decides whether the caller may make it (:mod:`fastlane.auth.roles`), the
caller is set as the API's access check sets it (:data:`~fastlane.auth.caller.current_caller`),
and the servicer method then validates the request, scopes it to the caller's tenant and writes
the audit trail exactly as for a gRPC client. So the console can show or do nothing the caller's
token could not through the API, and there is no second copy of any rule to keep in step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import Message

from fastlane.auth import roles
from fastlane.auth.caller import Caller, current_caller

PACKAGE = "fastlane.v1"
M = TypeVar("M", bound=Message)


class CallRefused(Exception):
    """A call the API answered with an error status: the page shows ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _LocalContext:
    """The part of a servicer context the servicers use: their errors end here as :class:`CallRefused`."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise CallRefused(code, details)

    def invocation_metadata(self) -> tuple[()]:
        return ()


class Gateway:
    """Calls of the API's methods as a given caller.

    Args:
        services: The servicer of each service, by its short name (``"JobService"``...).
    """

    def __init__(self, services: dict[str, object]) -> None:
        self._services = services

    @staticmethod
    def method_name(method: str) -> str:
        """The full gRPC name of ``"JobService/PauseJob"``: the key of the role table."""
        return f"/{PACKAGE}.{method}"

    def may(self, caller: Caller, method: str) -> bool:
        """Whether ``caller`` may call ``method`` (``"Service/Method"``): pages offer only those actions."""
        return roles.may_call(caller.role, self.method_name(method))

    async def call(self, caller: Caller, method: str, request: Message, response_type: type[M]) -> M:
        """Call ``method`` (``"Service/Method"``) with ``request`` as ``caller``.

        Raises:
            CallRefused: the role may not make the call (PERMISSION_DENIED), or the servicer
                refused it (its status and message, as a gRPC client would get them).
        """
        if not self.may(caller, method):
            raise CallRefused(grpc.StatusCode.PERMISSION_DENIED,
                              f"a {caller.role} token may not call {method.rsplit('/', 1)[-1]}")
        service, _, name = method.partition("/")
        behaviour: Callable[[Any, Any], Awaitable[Any]] = getattr(self._services[service], name)
        reset = current_caller.set(caller)
        try:
            response = await behaviour(request, _LocalContext())
        finally:
            current_caller.reset(reset)
        if not isinstance(response, response_type):
            raise TypeError(f"{method} answered {type(response).__name__}, not {response_type.__name__}")
        return response
