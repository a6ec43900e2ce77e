"""A job type's ready queue: fair across tenants, by priority within a tenant, and aging.

Released runs wait here only while no worker has a free credit for them; a credit takes the
next run as follows.

- **Across tenants, weighted round robin.** Tenants with runs waiting take turns; a tenant's turn
  is ``weight`` runs (1 by default). A tenant that releases a burst of 100,000 runs delays another
  tenant's next run by at most its own turn, not by its backlog: the complaint users of shared
  schedulers raise most (one tenant monopolising the workers).
- **Within a tenant, higher priority first, aging.** A run's effective priority grows by
  ``AGING_PER_SECOND`` for every second since it was due, so a run of the lowest priority
  overtakes runs of the highest that fell due ``(MAX_PRIORITY - MIN_PRIORITY) / AGING_PER_SECOND``
  seconds after it, and cannot wait behind newcomers for longer than that. Among runs of equal
  effective priority the one due first goes first. Because every run ages at the same rate, the
  order never changes while runs wait: the key ``due * AGING_PER_SECOND - priority`` is fixed
  when a run is queued, and one heap per tenant keeps it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from fastlane.domain.limits import MAX_PRIORITY, MIN_PRIORITY
from fastlane.domain.models import Run

AGING_PER_SECOND = 20.0
"""Priority points a waiting run gains per second: a run of priority -1000 overtakes runs of
priority 1000 that fell due 100 s after it."""

AGING_BOUND_SECONDS = (MAX_PRIORITY - MIN_PRIORITY) / AGING_PER_SECOND


class HoldsRun(Protocol):
    @property
    def run(self) -> Run: ...


W = TypeVar("W", bound=HoldsRun)
TenantWeight = Callable[[str], int]


def _equal_weights(_tenant: str) -> int:
    return 1


class ReadyQueue(Generic[W]):
    """The waiting runs of one job type (each wrapped in a ``W`` that holds it as ``.run``)."""

    def __init__(self, weight: TenantWeight = _equal_weights) -> None:
        self._weight = weight
        self._heaps: dict[str, list[tuple[float, int, W]]] = {}
        self._turns: deque[str] = deque()  # tenants with runs waiting, the one whose turn it is first
        self._turn_left = 0  # runs the first tenant may still take in its current turn
        self._order = itertools.count()  # ties: first queued, first out
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[W]:
        for heap in self._heaps.values():
            for _, _, waiting in heap:
                yield waiting

    def tenant_depths(self) -> dict[str, int]:
        # Also read by the metrics thread: list() takes the items in one step under the GIL.
        return {tenant: len(heap) for tenant, heap in list(self._heaps.items())}

    def append(self, waiting: W) -> None:
        run = waiting.run
        key = run.available_at.timestamp() * AGING_PER_SECOND - run.priority
        heap = self._heaps.get(run.tenant)
        if heap is None:
            heap = self._heaps[run.tenant] = []
            self._turns.append(run.tenant)
        heapq.heappush(heap, (key, next(self._order), waiting))
        self._size += 1

    def pop(self, tenant: str | None = None) -> W | None:
        """The next run by turn and priority; ``tenant``: the next of that tenant only (for a
        worker that serves one tenant), which leaves the turns as they are. None when empty."""
        if tenant is not None:
            return self._take(tenant) if tenant in self._heaps else None
        if not self._turns:
            return None
        current = self._turns[0]
        if self._turn_left <= 0:
            self._turn_left = max(self._weight(current), 1)
        waiting = self._take(current)
        self._turn_left -= 1
        if current in self._heaps and self._turn_left <= 0:
            self._turns.rotate(-1)  # its turn is over: to the back
        return waiting

    def remove_if(self, matches: Callable[[W], bool]) -> list[W]:
        """Take out every waiting run that ``matches``; return them."""
        removed: list[W] = []
        for tenant, heap in list(self._heaps.items()):
            kept = [entry for entry in heap if not matches(entry[2])]
            if len(kept) == len(heap):
                continue
            removed += [entry[2] for entry in heap if matches(entry[2])]
            heapq.heapify(kept)
            self._heaps[tenant] = kept
            if not kept:
                self._forget(tenant)
        self._size -= len(removed)
        return removed

    def _take(self, tenant: str) -> W:
        heap = self._heaps[tenant]
        waiting = heapq.heappop(heap)[2]
        self._size -= 1
        if not heap:
            self._forget(tenant)
        return waiting

    def _forget(self, tenant: str) -> None:
        del self._heaps[tenant]
        if self._turns and self._turns[0] == tenant:
            self._turn_left = 0  # the next tenant starts a fresh turn
        self._turns.remove(tenant)
