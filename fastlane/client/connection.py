"""The client's one channel to a daemon: opened on first use, its service stubs, the call wrapper
that turns a gRPC status into a fastlane error, and the wait for the daemon to serve."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastlane._proto import admin_pb2_grpc, jobs_pb2_grpc, runs_pb2_grpc, workflows_pb2_grpc
from fastlane.auth.tls import ClientTls
from fastlane.rpc.channel import load_token, open_channel
from fastlane.rpc.status import error_from_rpc

R = TypeVar("R")

# Reconnect quickly after a daemon restart instead of backing off for up to two minutes (the gRPC
# default), so a CLI call or wait_ready right after `fastlane serve` starts does not stall.
_CHANNEL_OPTIONS: Final = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
)


@dataclass(frozen=True, slots=True)
class Stubs:
    jobs: jobs_pb2_grpc.JobServiceStub
    runs: runs_pb2_grpc.RunServiceStub
    admin: admin_pb2_grpc.AdminServiceStub
    workflows: workflows_pb2_grpc.WorkflowServiceStub
    health: health_pb2_grpc.HealthStub


class Connection:
    """A lazily opened channel to one daemon, with a deadline on every call."""

    def __init__(self, server: str, *, timeout: float, token: str | None, tls: ClientTls | None) -> None:
        self.server = server
        self.timeout = timeout
        self._token = token if token is not None else load_token()
        self._tls = tls
        self._channel: grpc.aio.Channel | None = None
        self._stubs: Stubs | None = None

    @property
    def stubs(self) -> Stubs:
        if self._stubs is None:
            self._channel = open_channel(self.server, tls=self._tls, token=self._token, options=_CHANNEL_OPTIONS)
            self._stubs = Stubs(
                jobs=jobs_pb2_grpc.JobServiceStub(self._channel),
                runs=runs_pb2_grpc.RunServiceStub(self._channel),
                admin=admin_pb2_grpc.AdminServiceStub(self._channel),
                workflows=workflows_pb2_grpc.WorkflowServiceStub(self._channel),
                health=health_pb2_grpc.HealthStub(self._channel),
            )
        return self._stubs

    async def call(self, rpc: Callable[..., Awaitable[R]], request: Any) -> R:
        """One unary call within the deadline; a gRPC error comes back as the matching
        :class:`~fastlane.errors.RemoteError`."""
        try:
            return await rpc(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as error:
            raise error_from_rpc(error) from error

    async def close(self) -> None:
        channel, self._channel, self._stubs = self._channel, None, None
        if channel is not None:
            await channel.close()

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the daemon reports SERVING on the standard gRPC health service."""
        deadline = time.monotonic() + timeout
        request = health_pb2.HealthCheckRequest(service="")
        retryable = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.NOT_FOUND)
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                # wait_for_ready: while the daemon starts, the call waits for the connection
                # rather than failing at once, so the loop does not spin.
                # (types-grpcio-health-checking declares HealthStub without its generated methods.)
                check = self.stubs.health.Check  # type: ignore[attr-defined]
                response: health_pb2.HealthCheckResponse = await check(
                    request, timeout=min(remaining, 1.0), wait_for_ready=True)
            except grpc.aio.AioRpcError as error:
                if error.code() not in retryable:
                    raise error_from_rpc(error) from error
            else:
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
        raise TimeoutError(f"the fastlane daemon at {self.server} was not serving within {timeout:g} s")
