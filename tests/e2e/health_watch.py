"""Node health as a test sees it from outside: the gRPC health check polled every 50 ms, with
every transition kept, and which processes have died."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastlane.testing.processes import Daemon, Process


async def health_of(channel: grpc.aio.Channel) -> bool:
    """Whether the node says SERVING; a node that does not answer is not serving."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        response = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5)
    except grpc.aio.AioRpcError:
        return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


@dataclass
class HealthLog:
    """Every health transition of one node, as (monotonic time, serving)."""

    name: str
    transitions: list[tuple[float, bool]] = field(default_factory=list)

    @property
    def serving(self) -> bool:
        return bool(self.transitions) and self.transitions[-1][1]

    def note(self, at: float, serving: bool) -> None:
        if not self.transitions or self.transitions[-1][1] != serving:
            self.transitions.append((at, serving))

    def not_serving_between(self, start: float, end: float) -> float:
        """Seconds spent not serving in [start, end]."""
        total = 0.0
        for (at, serving), (until, _) in zip(self.transitions, [*self.transitions[1:], (end, True)], strict=True):
            if not serving:
                total += max(0.0, min(until, end) - max(at, start))
        return total

    def went_down_after(self, start: float) -> bool:
        return any(at >= start and not serving for at, serving in self.transitions)

    def back_after(self, start: float) -> float | None:
        """When the node last became SERVING after ``start`` and stayed so, or None."""
        if not self.serving:
            return None
        at = self.transitions[-1][0]
        return max(at, start)


async def watch_health(nodes: Sequence[Daemon], logs: dict[str, HealthLog]) -> None:
    """Poll every node's health every 50 ms until cancelled."""
    channels = {node.address: grpc.aio.insecure_channel(node.address) for node in nodes}
    try:
        while True:
            states = await asyncio.gather(*(health_of(channels[node.address]) for node in nodes))
            now = time.monotonic()
            for node, serving in zip(nodes, states, strict=True):
                logs[node.address].note(now, serving)
            await asyncio.sleep(0.05)
    finally:
        for channel in channels.values():
            await channel.close()


def alive(processes: Sequence[Process]) -> list[str]:
    """Why any of ``processes`` is no longer running (with its log tail), or nothing."""
    return [
        f"{process.log_path.name} exited with {process.popen.returncode}:\n{process.log_tail(60)}"
        for process in processes
        if process.popen is None or process.popen.poll() is not None
    ]
