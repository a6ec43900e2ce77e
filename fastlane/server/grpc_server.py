"""Build, start and stop a node's gRPC server with every service, health and reflection."""

from __future__ import annotations

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
from fastlane.domain.limits import PAYLOAD_CEILING_BYTES
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


class ApiServer:
    """The gRPC face of a node. Health says NOT_SERVING until :meth:`set_ready`."""

    def __init__(self, listen: str, *, jobs: JobServicer, runs: RunServicer, workers: WorkerServicer,
                 admin: AdminServicer, workflows: WorkflowServicer | None = None, interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 tls: ServerTls | None = None, health_listen: str | None = None) -> None:
        """``interceptors``: the access check when tokens are required; ``tls``: serve over TLS
        (mutual TLS when it names a client CA), its files re-read when they change;
        ``health_listen``: also serve the health service alone, in plain gRPC, on this address
        (Kubernetes' gRPC probes speak neither TLS nor tokens)."""
        self._server = grpc.aio.server(interceptors=list(interceptors), options=[
            # gRPC sets SO_REUSEPORT by default, so a second node started on a taken port would
            # listen beside the first and clients would reach either at random: refuse instead.
            ("grpc.so_reuseport", 0),
            # Above the largest payload a node may accept, so a too-large job is refused by the
            # validation point with the field named, not by the transport.
            ("grpc.max_receive_message_length", PAYLOAD_CEILING_BYTES + (1 << 20)),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ])
        jobs_pb2_grpc.add_JobServiceServicer_to_server(jobs, self._server)
        runs_pb2_grpc.add_RunServiceServicer_to_server(runs, self._server)
        workers_pb2_grpc.add_WorkerServiceServicer_to_server(workers, self._server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(admin, self._server)
        if workflows is not None:
            workflows_pb2_grpc.add_WorkflowServiceServicer_to_server(workflows, self._server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)
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
