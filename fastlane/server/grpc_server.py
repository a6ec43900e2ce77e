"""Build, start and stop a node's gRPC server with every service, health and reflection."""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fastlane._proto import (
    admin_pb2,
    admin_pb2_grpc,
    jobs_pb2,
    jobs_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    workers_pb2,
    workers_pb2_grpc,
    workflows_pb2,
    workflows_pb2_grpc,
)
from fastlane.auth.tls import ServerTls, server_credentials
from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES, MAX_CHECKPOINT_BYTES
from fastlane.errors import ConfigurationError
from fastlane.server.servicers.admin import AdminServicer
from fastlane.server.servicers.jobs import JobServicer
from fastlane.server.servicers.runs import RunServicer
from fastlane.server.servicers.workers import WorkerServicer
from fastlane.server.servicers.workflows import WorkflowServicer

SERVICE_NAMES = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    runs_pb2.DESCRIPTOR.services_by_name["RunService"].full_name,
    workers_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    workflows_pb2.DESCRIPTOR.services_by_name["WorkflowService"].full_name,
)

# What a caller can make the node hold: the access check (fastlane.server.access) runs before a
# call's request is read, so a caller without a valid token holds no more than the transport's
# buffers; a caller with one may hold one message of the largest size the server takes per call
# in flight. Both factors are bounded: a message is at most the largest valid request (the
# largest payload or checkpoint, plus this envelope for the rest of the request), and at most
# MAX_CONCURRENT_RPCS calls and streams are in flight at once (beyond it a call is refused with
# RESOURCE_EXHAUSTED). No per-connection stream limit: a client opening
# more streams than the limit before it has read the server's HTTP/2 settings has the rest reset
# (REFUSED_STREAM, which grpc reports as UNAVAILABLE), so a burst of calls on a new channel fails.
# The README's security section states the product.
MESSAGE_ENVELOPE_BYTES = 64 << 10
# Worker streams count too (one per worker process and node): room for hundreds of workers and
# their clients' calls.
MAX_CONCURRENT_RPCS = 1_000


def max_message_bytes(max_payload_bytes: int) -> int:
    """The largest request the server receives: a job of the largest payload, or a worker's
    largest checkpoint, with room for the rest of the request."""
    return max(max_payload_bytes, MAX_CHECKPOINT_BYTES) + MESSAGE_ENVELOPE_BYTES


def server_options(max_payload_bytes: int) -> list[tuple[str, int]]:
    """The API server's gRPC options."""
    return [
        # gRPC sets SO_REUSEPORT by default, so a second node started on a taken port would
        # listen beside the first and clients would reach either at random: refuse instead.
        ("grpc.so_reuseport", 0),
        # The largest valid request: a too-large payload within the envelope is refused by the
        # validation point with the field named, anything larger by the transport (RESOURCE_EXHAUSTED)
        # before a token is checked or a byte of it is parsed.
        ("grpc.max_receive_message_length", max_message_bytes(max_payload_bytes)),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ]


def _check_free(listen: str, *, flag: str = "") -> None:
    """Refuse an address another process listens on, before gRPC tries it: its failure is a raw
    C-core log line on stderr and a message that names no cause.

    Raises:
        ConfigurationError: ``cannot listen on HOST:PORT: the address is in use …``, or the
            system's reason (an address of no interface here, say).
    """
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return  # gRPC says what is wrong with it; port 0 is always free
    try:
        addresses = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ConfigurationError(f"cannot listen on {flag}{listen}: {error.strerror}") from error
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise ConfigurationError(f"cannot listen on {flag}{listen}: the address is in use (is another "
                                             "fastlane node running?)") from error
                raise ConfigurationError(f"cannot listen on {flag}{listen}: {error.strerror or error}") from error


class ApiServer:
    """The gRPC face of a node. Health says NOT_SERVING until :meth:`set_ready`."""

    def __init__(self, listen: str, *, jobs: JobServicer, runs: RunServicer, workers: WorkerServicer,
                 admin: AdminServicer, workflows: WorkflowServicer | None = None, interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 tls: ServerTls | None = None, health_listen: str | None = None,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        """``interceptors``: the access check when tokens are required; ``tls``: serve over TLS
        (mutual TLS when it names a client CA), its files re-read when they change;
        ``health_listen``: also serve the health service alone, in plain gRPC, on this address
        (Kubernetes' gRPC probes speak neither TLS nor tokens); ``max_payload_bytes``: the
        node's payload limit, which sets the largest message received (:func:`max_message_bytes`).

        The ports are bound here (a taken one raises :class:`ConfigurationError`), and served
        from :meth:`start`.
        """
        self.options = server_options(max_payload_bytes)
        self._server = grpc.aio.server(interceptors=list(interceptors), options=self.options,
                                       maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
        jobs_pb2_grpc.add_JobServiceServicer_to_server(jobs, self._server)
        runs_pb2_grpc.add_RunServiceServicer_to_server(runs, self._server)
        workers_pb2_grpc.add_WorkerServiceServicer_to_server(workers, self._server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(admin, self._server)
        if workflows is not None:
            workflows_pb2_grpc.add_WorkflowServiceServicer_to_server(workflows, self._server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)
        _check_free(listen)
        refused = ConfigurationError(
            f"cannot listen on {listen}: the address is in use (is another fastlane node running?) or invalid"
        )
        try:
            if tls is None:
                self.port = self._server.add_insecure_port(listen)
            else:
                self.port = self._server.add_secure_port(listen, server_credentials(tls))
        except RuntimeError as error:
            raise refused from error
        if self.port == 0:
            raise refused
        self._health_server: grpc.aio.Server | None = None
        self.health_port: int | None = None
        if health_listen is not None:
            _check_free(health_listen, flag="--health ")
            self._health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            health_pb2_grpc.add_HealthServicer_to_server(self._health, self._health_server)
            try:
                self.health_port = self._health_server.add_insecure_port(health_listen)
            except RuntimeError as error:
                raise ConfigurationError(f"cannot listen on --health {health_listen}: in use or invalid") from error
            if self.health_port == 0:
                raise ConfigurationError(f"cannot listen on --health {health_listen}: in use or invalid")

    async def start(self) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._server.start()
        if self._health_server is not None:
            await self._health_server.start()

    async def set_ready(self, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        await self._set_health(status)

    async def _set_health(self, status: int) -> None:
        for service in ("", *SERVICE_NAMES):
            await self._health.set(service, status)

    async def stop(self, grace: float) -> None:
        if self._health_server is not None:
            await self._health_server.stop(grace)
        await self._server.stop(grace)
