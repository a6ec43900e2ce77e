"""The local lease deadline: a node stops acting for its shards TTL less a margin after the start
of its last renewal that returned, whether or not the renewal under way ever returns."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from fastlane.domain.models import NodeInfo, ShardLease
from fastlane.engine.shards import ShardCallbacks, ShardOwnership
from fastlane.runtime.metrics import Metrics
from fastlane.testing import until

SHARDS = 2


class HangingStore:
    """Just enough of a Store for :class:`ShardOwnership`: acquiring works, renewing hangs while
    ``hang`` is set, even through cancellation (a driver whose cancellation is stuck too)."""

    server_epoch = 0  # never fails over

    @property
    def shards(self) -> HangingStore:  # the part of a store this fake plays
        return self

    def __init__(self) -> None:
        self.hang = False
        self.renewal_started = asyncio.Event()
        self.unstuck = asyncio.Event()

    async def db_now(self) -> datetime:
        return datetime.now(UTC)

    async def heartbeat_node(self, node: NodeInfo, ttl: timedelta) -> list[NodeInfo]:
        return [node]

    async def shard_count(self) -> int:
        return SHARDS

    async def list_shards(self) -> list[ShardLease]:
        return []

    async def acquire_shards(self, node_id: str, ttl: timedelta, *, limit: int) -> list[ShardLease]:
        expires = datetime.now(UTC) + ttl
        return [ShardLease(shard_id=i, owner=node_id, token=1, lease_expires_at=expires) for i in range(limit)]

    async def renew_shards(self, leases: Sequence[ShardLease], ttl: timedelta) -> list[ShardLease]:
        if self.hang:
            self.renewal_started.set()
            try:
                await self.unstuck.wait()
            except asyncio.CancelledError:
                await self.unstuck.wait()  # cancelled, and still stuck
                raise
        return list(leases)

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        pass

    async def remove_node(self, node_id: str) -> None:
        pass


class ManualClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ownership_of(store: HangingStore, ttl: timedelta, lost: list[tuple[float, list[int]]],
                 monotonic=time.monotonic, built: list[int] | None = None) -> ShardOwnership:  # type: ignore[no-untyped-def]
    async def build(leases: Sequence[ShardLease]) -> None:
        if built is not None:
            built.extend(lease.shard_id for lease in leases)

    return ShardOwnership(
        store, node_id="node-a", ttl=ttl, metrics=Metrics(),  # type: ignore[arg-type]
        listener=ShardCallbacks(build, lambda ids: lost.append((time.monotonic(), sorted(ids)))), monotonic=monotonic,
    )


async def stopped(ownership: ShardOwnership, task: asyncio.Task[None], store: HangingStore) -> None:
    store.unstuck.set()
    await ownership.stop()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)


async def test_a_hung_renewal_stops_fencing_at_the_local_deadline():
    clock = ManualClock()
    store = HangingStore()
    lost: list[tuple[float, list[int]]] = []
    ttl = timedelta(seconds=30)  # margin min(1 s, TTL/10) = 1 s; real-time cycles and timers stay far off
    ownership = ownership_of(store, ttl, lost, monotonic=clock)
    task = asyncio.create_task(ownership.run(asyncio.Event()), name="ownership")
    try:
        await until(lambda: len(ownership.leases) == SHARDS)
        acquired_at = clock.now  # the acquire call started on this (unmoving) clock
        store.hang = True
        clock.now += 5.0
        ownership.wake()  # a renewal, begun now, that never returns
        await asyncio.wait_for(store.renewal_started.wait(), 5)

        clock.now = acquired_at + 30 - 1 - 0.001
        assert ownership.fence(0) is not None
        assert ownership.owned() == [0, 1]
        clock.now = acquired_at + 30 - 1 + 0.001
        assert ownership.fence(0) is None, "fenced past TTL less the margin after the last renewal's start"
        assert ownership.owned() == []
    finally:
        await stopped(ownership, task, store)


async def test_shards_are_dropped_at_the_deadline_while_the_renewal_is_still_stuck():
    store = HangingStore()
    lost: list[tuple[float, list[int]]] = []
    ttl = timedelta(seconds=0.6)  # margin 0.06 s: the deadline is 0.54 s after the last renewal began
    built: list[int] = []
    ownership = ownership_of(store, ttl, lost, built=built)
    task = asyncio.create_task(ownership.run(asyncio.Event()), name="ownership")
    try:
        await until(lambda: len(ownership.leases) == SHARDS)
        store.hang = True
        await asyncio.wait_for(store.renewal_started.wait(), 5)
        hung_at = time.monotonic()  # no later than the start of the first renewal that hangs
        await until(lambda: lost, timeout=2)
        dropped_at, shard_ids = lost[0]
        assert shard_ids == [0, 1]
        assert not store.unstuck.is_set(), "dropped while the renewal call had not returned"
        # The last renewal that returned began at most one cycle (TTL/3) before the hung one, so
        # the drop comes by 0.54 s; the slack is for a timer firing late on a loaded machine.
        assert dropped_at - hung_at < 0.54 + 0.25, f"dropped {dropped_at - hung_at:.3f} s after the hang began"
        assert ownership.leases == {} and ownership.owned() == []

        # The stuck call returns at last, renewed: that brings nothing back behind the lane's
        # back (it forgot those shards). Held again means acquired again, windows rebuilt.
        built.clear()
        store.hang = False
        store.unstuck.set()
        await asyncio.sleep(0.1)
        assert set(ownership.leases) <= set(built)
    finally:
        await stopped(ownership, task, store)


class SlowAcquireStore(HangingStore):
    """Acquiring waits for ``go``: a lease cycle is under way when the node is told to stop."""

    def __init__(self) -> None:
        super().__init__()
        self.acquiring = asyncio.Event()
        self.go = asyncio.Event()
        self.released: list[int] = []

    async def acquire_shards(self, node_id: str, ttl: timedelta, *, limit: int) -> list[ShardLease]:
        self.acquiring.set()
        await self.go.wait()
        return await super().acquire_shards(node_id, ttl, limit=limit)

    async def release_shards(self, leases: Sequence[ShardLease]) -> None:
        self.released += [lease.shard_id for lease in leases]


async def test_shards_a_cycle_acquires_while_the_node_stops_are_released_too():
    store = SlowAcquireStore()
    ownership = ownership_of(store, timedelta(seconds=3), [])
    running = asyncio.create_task(ownership.run(asyncio.Event()))
    try:
        await asyncio.wait_for(store.acquiring.wait(), 5)
        stopping = asyncio.create_task(ownership.stop())
        await asyncio.sleep(0)  # stop() is waiting for the cycle, not releasing yet
        assert not stopping.done()
        store.go.set()  # the cycle acquires after the stop began
        await asyncio.wait_for(stopping, 5)
        await asyncio.wait_for(running, 5)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    assert sorted(store.released) == list(range(SHARDS))
    assert ownership.leases == {}
