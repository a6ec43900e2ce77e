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
- **Urgent runs can be taken alone.** With ``urgent_priority`` set, a tenant's runs of at least
  that priority wait in a heap of their own beside the others; an ordinary ``pop`` takes the
  better of the two tops (the same order as one heap), and ``pop(urgent_only=True)`` takes from
  the urgent heaps only: the credits a node keeps for urgent runs (``--priority-reserve``) are
  given to them and to nothing else.

For the metrics, each tenant also has a heap of its runs' due times, cleaned of runs taken out
after every change, so its top is the oldest waiting run's due time (``oldest_dues``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from datetime import datetime
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


class _TenantRuns(Generic[W]):
    """One tenant's waiting runs: two heaps by the fixed aging key, urgent runs apart."""

    __slots__ = ("ordinary", "urgent")

    def __init__(self) -> None:
        self.ordinary: list[tuple[float, int, W]] = []
        self.urgent: list[tuple[float, int, W]] = []

    def __len__(self) -> int:
        return len(self.ordinary) + len(self.urgent)

    def entries(self) -> Iterator[tuple[float, int, W]]:
        yield from self.ordinary
        yield from self.urgent

    def pop(self, urgent_only: bool) -> tuple[float, int, W] | None:
        """The first entry by key (of the urgent heap only if ``urgent_only``); None if none."""
        ordinary, urgent = self.ordinary, self.urgent
        if urgent and (urgent_only or not ordinary or urgent[0] < ordinary[0]):
            return heapq.heappop(urgent)
        if urgent_only or not ordinary:
            return None
        return heapq.heappop(ordinary)


class ReadyQueue(Generic[W]):
    """The waiting runs of one job type (each wrapped in a ``W`` that holds it as ``.run``).

    Args:
        weight: Runs per turn of each tenant.
        urgent_priority: Runs of at least this priority can be taken alone (``pop(urgent_only=True)``);
            None: no run is urgent.
    """

    def __init__(self, weight: TenantWeight = _equal_weights, urgent_priority: int | None = None) -> None:
        self._weight = weight
        self._urgent_priority = urgent_priority
        self._heaps: dict[str, _TenantRuns[W]] = {}
        self._turns: deque[str] = deque()  # tenants with runs waiting, the one whose turn it is first
        self._turn_left = 0  # runs the first tenant may still take in its current turn
        self._order = itertools.count()  # ties: first queued, first out
        self._size = 0
        # Per tenant: (due, order) of its runs; the run's own datetime rather than a float made
        # for it, one object less per waiting run.
        self._due: dict[str, list[tuple[datetime, int]]] = {}
        self._taken: set[int] = set()  # orders taken out but still in a _due heap below its top

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[W]:
        for runs in self._heaps.values():
            for _, _, waiting in runs.entries():
                yield waiting

    def has_urgent(self) -> bool:
        """Whether any urgent run waits (cheap enough to ask before every urgent-only pop)."""
        return any(runs.urgent for runs in self._heaps.values())

    def tenant_depths(self) -> dict[str, int]:
        # Also read by the metrics thread: list() takes the items in one step under the GIL.
        return {tenant: len(runs) for tenant, runs in list(self._heaps.items())}

    def oldest_dues(self) -> dict[str, float]:
        """The due time (epoch seconds) of each tenant's oldest waiting run; read by the metrics
        thread, which only reads: the loop thread keeps each heap's top a waiting run."""
        return {tenant: heap[0][0].timestamp() for tenant, heap in list(self._due.items()) if heap}

    def append(self, waiting: W) -> None:
        run = waiting.run
        key = run.available_at.timestamp() * AGING_PER_SECOND - run.priority
        runs = self._heaps.get(run.tenant)
        if runs is None:
            runs = self._heaps[run.tenant] = _TenantRuns()
            self._due[run.tenant] = []
            self._turns.append(run.tenant)
        order = next(self._order)
        urgent = self._urgent_priority is not None and run.priority >= self._urgent_priority
        heapq.heappush(runs.urgent if urgent else runs.ordinary, (key, order, waiting))
        heapq.heappush(self._due[run.tenant], (run.available_at, order))
        self._size += 1

    def pop(self, tenant: str | None = None, blocked: Blocked | None = None, *, urgent_only: bool = False) -> W | None:
        """The next run by turn and priority; ``tenant``: the next of that tenant only (for a
        worker that serves one tenant), which leaves the turns as they are. Tenants ``blocked``
        are passed over (keeping their place in the turns). ``urgent_only``: the next urgent
        run. None when no run may go."""
        if tenant is not None:
            if tenant not in self._heaps or (blocked and blocked(tenant)):
                return None
            return self._take(tenant, urgent_only)
        if urgent_only:
            return self._pop_urgent(blocked)
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
        waiting = self._take(current, False)
        self._turn_left -= 1
        if current in self._heaps and self._turn_left <= 0:
            self._turns.rotate(-1)  # its turn is over: to the back
        return waiting

    def _pop_urgent(self, blocked: Blocked | None) -> W | None:
        """The urgent run of the first tenant in turn order that has one and may take it; that
        tenant then goes to the back, so tenants with urgent runs take turns too."""
        index = next((i for i, tenant in enumerate(self._turns)
                      if self._heaps[tenant].urgent and not (blocked and blocked(tenant))), None)
        if index is None:
            return None
        current = self._turns[index]
        waiting = self._take(current, True)
        if current in self._heaps:
            del self._turns[index]
            self._turns.append(current)
        if index == 0:
            self._turn_left = 0  # the tenant now first starts a fresh turn
        return waiting

    def remove_if(self, matches: Callable[[W], bool]) -> list[W]:
        """Take out every waiting run that ``matches``; return them."""
        removed: list[W] = []
        for tenant, runs in list(self._heaps.items()):
            gone = [entry[2] for entry in runs.entries() if matches(entry[2])]
            if not gone:
                continue
            removed += gone
            if len(gone) == len(runs):
                self._forget(tenant)
                continue
            for heap in (runs.ordinary, runs.urgent):
                heap[:] = [entry for entry in heap if not matches(entry[2])]
                heapq.heapify(heap)
            self._taken.difference_update(order for _, order in self._due[tenant])
            self._due[tenant] = [(entry[2].run.available_at, entry[1]) for entry in runs.entries()]
            heapq.heapify(self._due[tenant])
        self._size -= len(removed)
        return removed

    def _take(self, tenant: str, urgent_only: bool) -> W | None:
        runs = self._heaps[tenant]
        entry = runs.pop(urgent_only)
        if entry is None:
            return None
        _, order, waiting = entry
        self._size -= 1
        if not runs:
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
