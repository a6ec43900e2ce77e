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
- **Tenants at their cap are passed over** (``blocked``): their runs keep their place and their
  turn comes again once the tenant has room (``--tenant-max-in-flight``).

For the metrics, each tenant also has a heap of its runs' due times, cleaned of runs taken out
after every change, so its top is the oldest waiting run's due time (``oldest_dues``).
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
Blocked = Callable[[str], bool]  # whether a tenant may take no run now


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
        self._due: dict[str, list[tuple[float, int]]] = {}  # per tenant: (due, order) of its runs
        self._taken: set[int] = set()  # orders taken out but still in a _due heap below its top

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

    def oldest_dues(self) -> dict[str, float]:
        """The due time (epoch seconds) of each tenant's oldest waiting run; read by the metrics
        thread, which only reads: the loop thread keeps each heap's top a waiting run."""
        return {tenant: heap[0][0] for tenant, heap in list(self._due.items()) if heap}

    def append(self, waiting: W) -> None:
        run = waiting.run
        due = run.available_at.timestamp()
        key = due * AGING_PER_SECOND - run.priority
        heap = self._heaps.get(run.tenant)
        if heap is None:
            heap = self._heaps[run.tenant] = []
            self._due[run.tenant] = []
            self._turns.append(run.tenant)
        order = next(self._order)
        heapq.heappush(heap, (key, order, waiting))
        heapq.heappush(self._due[run.tenant], (due, order))
        self._size += 1

    def pop(self, tenant: str | None = None, blocked: Blocked | None = None) -> W | None:
        """The next run by turn and priority; ``tenant``: the next of that tenant only (for a
        worker that serves one tenant), which leaves the turns as they are. Tenants ``blocked``
        are passed over (keeping their place in the turns). None when no run may go."""
        if tenant is not None:
            return self._take(tenant) if tenant in self._heaps and not (blocked and blocked(tenant)) else None
        for _ in range(len(self._turns)):
            current = self._turns[0]
            if blocked is None or not blocked(current):
                break
            self._turns.rotate(-1)
            self._turn_left = 0
        else:
            return None
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
            if not kept:
                self._forget(tenant)
                continue
            heapq.heapify(kept)
            self._heaps[tenant] = kept
            self._taken.difference_update(order for _, order in self._due[tenant])
            self._due[tenant] = [(entry[2].run.available_at.timestamp(), entry[1]) for entry in kept]
            heapq.heapify(self._due[tenant])
        self._size -= len(removed)
        return removed

    def _take(self, tenant: str) -> W:
        heap = self._heaps[tenant]
        _, order, waiting = heapq.heappop(heap)
        self._size -= 1
        if not heap:
            self._forget(tenant)
            return waiting
        due, taken = self._due[tenant], self._taken
        taken.add(order)
        while due and due[0][1] in taken:  # keep the top a waiting run (see oldest_dues)
            taken.discard(heapq.heappop(due)[1])
        return waiting

    def _forget(self, tenant: str) -> None:
        del self._heaps[tenant]
        self._taken.difference_update(order for _, order in self._due.pop(tenant))
        if self._turns and self._turns[0] == tenant:
            self._turn_left = 0  # the next tenant starts a fresh turn
        self._turns.remove(tenant)
