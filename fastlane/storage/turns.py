"""Turns at SQLite's single writer: one at a time, lease upkeep ahead of data writes.

A node renews its shard leases every few seconds; if the renewal queued behind a run of large
batches (materialising a crowd, journalling thousands of results) the lease could run out while
the node is healthy. Urgent turns wait only for the transaction in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class WriteTurns:
    """A FIFO lock with two queues; ``urgent`` waiters are served before the others."""

    def __init__(self) -> None:
        self._busy = False
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._normal: deque[asyncio.Future[None]] = deque()

    @contextlib.asynccontextmanager
    async def turn(self, *, urgent: bool = False) -> AsyncIterator[None]:
        queue = self._urgent if urgent else self._normal
        if self._busy or self._urgent or (not urgent and self._normal):
            waiter = asyncio.get_running_loop().create_future()
            queue.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._hand_on()  # the turn came with the cancellation: pass it on
                else:
                    with contextlib.suppress(ValueError):  # already skipped by a hand-on
                        queue.remove(waiter)
                raise
        else:
            self._busy = True
        try:
            yield
        finally:
            self._hand_on()

    def _hand_on(self) -> None:
        """Give the turn to the next waiter (it stays busy), or free it."""
        for queue in (self._urgent, self._normal):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._busy = False
