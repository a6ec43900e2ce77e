"""A worker's Prometheus metrics, served on ``fastlane worker --metrics HOST:PORT``
(``Worker(metrics="HOST:PORT")``): its handlers' attempts and durations by job type, what it is
running, the credits it has free, its reconnects to each node and each node's clock as it
measures it (the offset and its uncertainty, which decide whether runs are sent to it ahead).

Counted only when asked for: a worker without ``metrics`` has none of this on its run path. The
job types are the worker's own (the handlers it registered), so their number is bounded by its
code, and a worker serves one tenant's runs or any: there is no tenant label.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, start_http_server

from fastlane.domain.models import AttemptOutcome
from fastlane.errors import ConfigurationError
from fastlane.runtime.metrics import ReadWhenScraped
from fastlane.worker._clock import ClockEstimate


class _Ended(Protocol):
    @property
    def outcome(self) -> AttemptOutcome: ...


E = TypeVar("E", bound=_Ended)  # how an attempt ended (the worker's Verdict)

# Handler durations: from a millisecond to an hour.
_HANDLER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class WorkerMetrics:
    """One worker's registry, and what its run path reports into it."""

    def __init__(self, credits_free: Callable[[], float] = lambda: 0.0,
                 clock_estimates: Callable[[], Mapping[str, ClockEstimate]] = dict) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.attempts = Counter("fastlane_worker_attempts", "Attempts this worker's handlers ended, by job type "
                                "and outcome (succeeded, failed, permanent_failure, timed_out, cancelled)",
                                ["job_type", "outcome"], registry=registry)
        self.handler_seconds = Histogram("fastlane_worker_handler_seconds", "How long each handler call took, "
                                         "entered to ended, by job type", ["job_type"], buckets=_HANDLER_BUCKETS,
                                         registry=registry)
        self.running = Gauge("fastlane_worker_handlers_running", "Handlers running now", registry=registry)
        self.credits = Gauge("fastlane_worker_credits_free",
                             "Runs this worker could take now: its concurrency less what it runs or holds, over "
                             "every node", registry=registry)
        self.credits.set_function(credits_free)
        self._server: WSGIServer | None = None
        self.reconnects = Counter("fastlane_worker_reconnects", "Times this worker dialled a node again after its "
                                  "stream ended or could not be opened, by node address", ["node"], registry=registry)
        offsets = ReadWhenScraped("fastlane_worker_clock_offset_seconds", "Each node's clock minus this worker's, "
                                  "as the worker measured it, by node address", ["node"])
        uncertainties = ReadWhenScraped("fastlane_worker_clock_uncertainty_seconds", "How far each clock offset "
                                        "may be off (half its best round trip), by node address", ["node"])
        offsets.read = lambda: {(node, ): estimate.offset_s for node, estimate in clock_estimates().items()}
        uncertainties.read = lambda: {(node, ): estimate.uncertainty_s for node, estimate in clock_estimates().items()}
        registry.register(offsets)
        registry.register(uncertainties)

    async def observed(self, job_type: str, attempt: Awaitable[E]) -> E:
        """``attempt`` (a handler's call, judged) awaited, counted and timed."""
        self.running.inc()
        began = time.perf_counter()
        try:
            ended = await attempt
        finally:
            self.running.dec()
        self.handler_seconds.labels(job_type).observe(time.perf_counter() - began)
        self.attempts.labels(job_type, ended.outcome.value).inc()
        return ended

    def reconnected(self, node: str) -> None:
        self.reconnects.labels(node).inc()

    def serve(self, listen: str) -> None:
        """Expose /metrics over HTTP on ``HOST:PORT`` (a daemon thread) until :meth:`close`, without
        ``_created`` series."""
        host, _, port = listen.rpartition(":")
        disable_created_metrics()  # type: ignore[no-untyped-call]  # the library leaves it unannotated
        try:
            self._server, _ = start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=self.registry)
        except (OSError, ValueError) as error:
            raise ConfigurationError(f"--metrics {listen}: cannot listen: {getattr(error, 'strerror', None) or error}") \
                from error

    def close(self) -> None:
        """Stop serving (blocks until the server's thread has seen it: well under a second)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
