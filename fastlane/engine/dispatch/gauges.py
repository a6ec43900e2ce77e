"""What the metrics read of the dispatcher when scraped: runs *queued* in its ready queues, *blocked*
by a cap, *parked*, and *in flight*, by label, and its worker streams.

Every reader here runs on the metrics thread, not the event loop: each takes a collection with
``list()`` in one step under the GIL, so a queue or session added meanwhile cannot break the
iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sized
from typing import Any

from fastlane.engine.dispatch.in_flight import InFlight
from fastlane.engine.dispatch.key_gate import KeyGate
from fastlane.engine.dispatch.messages import WorkerSession
from fastlane.engine.dispatch.ready_queue import ReadyQueue
from fastlane.runtime.clock import Clock
from fastlane.runtime.metrics import Metrics


class DispatchGauges:
    """The dispatcher's state as labelled readings, set as the readers of its metrics."""

    def __init__(
        self, metrics: Metrics, *, clock: Clock, ready: Mapping[str, ReadyQueue[Any]],
        sessions: Mapping[str, list[WorkerSession]], gate: KeyGate, parked: Sized, in_flight: InFlight,
        tenant_full: Callable[[str], bool], serves: Callable[[str, str], bool],
    ) -> None:
        """``ready``, ``sessions``: the dispatcher's own, by job type (read, never changed here);
        ``tenant_full``, ``serves``: its rules for a tenant at its cap and a queue some worker serves."""
        self._clock = clock
        self._ready = ready
        self._sessions = sessions
        self._gate = gate
        self._tenant_full = tenant_full
        self._serves = serves
        metrics.ready_queue.set_function(lambda: self.ready_depth)
        metrics.ready_by_tenant.read = self.ready_depths
        metrics.oldest_ready.read = self.oldest_ready_ages
        metrics.in_flight_by_tenant.read = in_flight.counts
        metrics.held_by_cap.read = self.blocked_depths  # fastlane_held_runs: the metric keeps its name
        metrics.unserved.read = self.unserved_depths
        metrics.worker_streams.read = lambda: {(kind,): len(streams) for kind, streams in list(sessions.items()) if streams}
        metrics.parked.set_function(lambda: len(parked))

    @property
    def ready_depth(self) -> int:
        """Runs queued in all the ready queues."""
        return sum(map(len, list(self._ready.values())))

    def ready_depths(self) -> dict[tuple[str, str], int]:
        """Runs queued in the ready queues, by (job type, tenant)."""
        return {(kind, tenant): n for kind, queue in list(self._ready.items()) for tenant, n in queue.tenant_depths().items()}

    def oldest_ready_ages(self) -> dict[tuple[str, str], float]:
        """Seconds since the oldest queued run of each (job type, tenant) was due."""
        now = self._clock.now().timestamp()
        return {(kind, tenant): max(now - due, 0.0) for kind, queue in list(self._ready.items())
                for tenant, due in queue.oldest_dues().items()}

    def blocked_depths(self) -> dict[tuple[str, str, str], int]:
        """Runs blocked by a cap, by (job type, tenant, cap)."""
        blocked = {(kind, tenant, "concurrency_key"): n for (kind, tenant), n in self._gate.depths().items()}
        for kind, queue in list(self._ready.items()):
            for tenant, n in queue.tenant_depths().items():
                if self._tenant_full(tenant):
                    blocked[(kind, tenant, "tenant_in_flight")] = n
        return blocked

    def unserved_depths(self) -> dict[tuple[str, str], int]:
        """Runs queued of a (job type, tenant) no connected worker serves (none for the type, or
        only workers bound to other tenants)."""
        return {(kind, tenant): n for kind, queue in list(self._ready.items())
                for tenant, n in queue.tenant_depths().items() if not self._serves(kind, tenant)}
