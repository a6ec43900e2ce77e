"""Shard ownership: membership, fair shares, leases renewed in time, and hand-over.

Every cycle (a third of the lease TTL, or at once when another node joins or leaves) a node
measures its clock against the database's, heartbeats its row in ``nodes``, works out its fair
share of the shards among the live eligible nodes, renews what it holds, releases what is above
its share (it stops firing those first) and acquires free shards up to it. A node whose clock is
off by more than the bound is not eligible: it owns nothing and says why.

A node owns a shard only while it has renewed the lease in time. Renewal is judged by the
database; locally the node keeps a conservative deadline (measured from *before* the renew
call, minus a margin) and :meth:`ShardOwnership.fence` stops answering for a shard the moment
that deadline passes, so the node stops firing before any other node can take the shard over —
even if the renewal itself is stuck.

How a hang is bounded: a network that stops answering (packets dropped, no reset) leaves the
renewal call waiting, possibly until a client timeout (3/4 TTL) or the cycle's own (TTL/3), or
longer if the driver's cancellation hangs too. None of that matters for safety: the database
extends a lease only by a statement it ran, which it ran after the call started, so the lease
lasts at least until ``start of the last renewal that returned + TTL``. The node's deadline is
that moment less a margin (min(1 s, TTL/10), for the database judging expiry a little early),
on the monotonic clock. The fire path compares it (:meth:`ShardOwnership.fence`, a float
comparison, no await) before each release, and a timer set for that moment drops every shard
at once — the lane's heaps and the dispatcher's queues with them — without waiting for the
stuck call to return. A renewal that returns after the deadline brings nothing back: the
shards are taken again, with new tokens, once the database lets their leases run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from fastlane.domain.errors import StorageError
from fastlane.domain.models import NodeInfo, ShardLease
from fastlane.errors import FastlaneError
from fastlane.runtime.aio import first_of
from fastlane.runtime.clock import Clock, CorrectedClock, SystemClock
from fastlane.runtime.metrics import Metrics
from fastlane.runtime.supervise import Backoff
from fastlane.storage import Store

log = logging.getLogger("fastlane.shards")

CHANGE_SLACK = 0.02  # seconds after a lease or heartbeat runs out before looking again
DEFAULT_MAX_CLOCK_OFFSET = timedelta(milliseconds=500)  # --max-clock-offset: beyond it a node owns no shards

ShardsAcquired = Callable[[Sequence[ShardLease]], Awaitable[None]]
ShardsLost = Callable[[Sequence[int]], None]
WorkerCount = Callable[[], int]
Monotonic = Callable[[], float]


class ShardListener(Protocol):
    """What hears of the shards this node gains and loses (the fast lane and the dispatcher)."""

    async def acquired(self, leases: Sequence[ShardLease]) -> None:
        """Build the windows of newly acquired shards; raising gives them back."""
        ...

    def lost(self, shard_ids: Sequence[int]) -> None:
        """Forget these shards at once: nothing more may fire for them."""
        ...


@dataclass(frozen=True, slots=True)
class ShardCallbacks:
    """A :class:`ShardListener` of two functions (for tests and small tools)."""

    on_acquired: ShardsAcquired
    on_lost: ShardsLost

    async def acquired(self, leases: Sequence[ShardLease]) -> None:
        await self.on_acquired(leases)

    def lost(self, shard_ids: Sequence[int]) -> None:
        self.on_lost(shard_ids)


class _NoListener:
    async def acquired(self, leases: Sequence[ShardLease]) -> None:
        pass

    def lost(self, shard_ids: Sequence[int]) -> None:
        pass


def fair_share(node_id: str, live: Sequence[NodeInfo], shard_count: int) -> int:
    """This node's share: shards split evenly over eligible live nodes, the remainder to the
    first in node id order, so every node computes the same split."""
    eligible = sorted(node.node_id for node in live if node.eligible)
    if node_id not in eligible:
        return 0
    base, extra = divmod(shard_count, len(eligible))
    return base + (1 if eligible.index(node_id) < extra else 0)


class ShardOwnership:
    """Keeps this node's shard leases alive and tells the fast lane what it gained or lost."""

    def __init__(
        self,
        store: Store,
        *,
        node_id: str,
        ttl: timedelta,
        metrics: Metrics,
        listener: ShardListener | None = None,
        address: str = "",
        clock: Clock | None = None,
        max_clock_offset: timedelta = DEFAULT_MAX_CLOCK_OFFSET,
        workers: WorkerCount = lambda: 0,
        monotonic: Monotonic = time.monotonic,
    ) -> None:
        """``listener`` hears of the shards gained and lost; it may also be given by :meth:`listen`
        before :meth:`run`. ``monotonic`` (seconds) measures the local lease deadline; injectable
        for tests."""
        self._store = store
        self._node_id = node_id
        self._address = address
        self._clock = clock or SystemClock()
        self._max_clock_offset = max_clock_offset
        self._workers = workers
        self.clock_offset = timedelta(0)
        self.note = ""
        self._share = 0
        self._wake = asyncio.Event()
        self._next_change_at: datetime | None = None
        self._monotonic = monotonic
        self._last_upkeep = monotonic()
        self._ttl = ttl
        self._metrics = metrics
        self._listener: ShardListener = listener or _NoListener()
        self._leases: dict[int, ShardLease] = {}
        self._server_epoch = store.server_epoch  # the database server history the leases are from
        self._valid_until = 0.0  # monotonic deadline of the last successful renewal, less a margin
        self._expiry: asyncio.TimerHandle | None = None  # drops every shard at that deadline
        # The database may judge expiry a little before our monotonic clock does.
        self._margin = min(1.0, ttl.total_seconds() / 10)
        self._stopping = asyncio.Event()
        # Held by each lease cycle, and by stop() before it releases: a cycle under way when the
        # node stops would otherwise acquire, after the release, the very shards just released.
        self._cycle = asyncio.Lock()
        self._rebuilds: set[asyncio.Task[None]] = set()
        self._ready = asyncio.Event()  # set once the first windows are built
        self._upkeep_done = asyncio.Event()  # set by each lease cycle that reached the database

    @property
    def leases(self) -> dict[int, ShardLease]:
        return self._leases

    def fence(self, shard_id: int) -> ShardLease | None:
        """The lease to fence writes for ``shard_id`` with, or None if this node may not act for it
        (past the local lease deadline, even before the shards are dropped)."""
        if self._monotonic() > self._valid_until:
            return None
        return self._leases.get(shard_id)

    def owned(self) -> list[int]:
        if self._monotonic() > self._valid_until:
            return []
        return sorted(self._leases)

    @property
    def healthy(self) -> bool:
        """Whether the last lease cycle that reached the database is recent (within a TTL)."""
        return self._monotonic() - self._last_upkeep < self._ttl.total_seconds()

    def wake(self) -> None:
        """Look at the cluster again now (a node joined or left)."""
        self._wake.set()

    def listen(self, listener: ShardListener) -> None:
        """Tell ``listener`` of the shards gained and lost from now on: before :meth:`run`, which
        alone acquires (the fast lane is built over this ownership, then listens to it)."""
        self._listener = listener

    async def run(self, ready: asyncio.Event) -> None:
        """Acquire, then renew every third of the TTL until stopped. ``ready`` is set once this
        node holds its fair share of the shards and their windows are built."""
        self._ready = ready
        interval = self._ttl.total_seconds() / 3
        # While the database is out of reach, look again sooner than a full cycle: the node
        # serves again (and re-acquires its share) soon after the database is back.
        retry = Backoff(first=0.1, cap=interval)
        failures = 0
        while not self._stopping.is_set():
            self._wake.clear()
            step = "renewing leases"
            try:
                async with self._cycle, asyncio.timeout(interval):
                    if self._stopping.is_set():
                        break
                    await self._renew()
                    step = "heartbeating membership"
                    await self._follow_membership()
                    step = "releasing shards above the fair share"
                    await self._release_excess()
                    step = "acquiring shards"
                    await self._acquire()
                if self._owns_share_built():
                    ready.set()
                self._upkept()
                failures = 0
            except StorageError as error:
                failures += 1
                log.warning("shard lease upkeep failed while %s: %s", step, error)
            except TimeoutError:
                failures += 1
                log.warning("shard lease upkeep timed out after %.1f s while %s", interval, step)
            self._expire_locally()
            if self._stopping.is_set():
                break
            wait = self._until_next_cycle(interval)
            if failures:
                wait = min(wait, retry.delay(failures))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await first_of(self._stopping, self._wake)

    def _owns_share_built(self) -> bool:
        """Whether this node holds its whole fair share with every window built: only then is
        it ready. After a crash and restart, the leases of the previous incarnation are owned
        until they run out; a node that said SERVING before would fire nothing meanwhile."""
        return not self._rebuilds and len(self._leases) >= self._share

    def _upkept(self) -> None:
        """A lease cycle reached the database: healthy (again) for a TTL from now."""
        self._last_upkeep = self._monotonic()
        self._upkeep_done.set()

    async def health_changed(self, healthy: bool) -> None:
        """Return once :attr:`healthy` differs from ``healthy``: woken by a cycle that reached
        the database, or by the moment the last one grows older than a TTL."""
        while self.healthy == healthy:
            self._upkeep_done.clear()
            timeout = None
            if healthy:
                timeout = max(self._last_upkeep + self._ttl.total_seconds() - self._monotonic(), 0.0) + CHANGE_SLACK
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._upkeep_done.wait()

    async def _follow_membership(self) -> None:
        """Measure the clock, heartbeat, and work out this node's fair share."""
        # Measured against the wall clock as it is: a corrected clock takes the measurement and
        # fires on it; the bound judges how far the host's own clock is off.
        corrected = self._clock if isinstance(self._clock, CorrectedClock) else None
        wall = corrected.wall_now if corrected is not None else self._clock.now
        steps = corrected.steps if corrected is not None else 0
        before = wall()
        database_now = await self._store.db_now()
        after = wall()
        # The database's time was read somewhere within the round trip, so the offset is known
        # only to within half of it. A busy node can take long to see the answer: that is no
        # reason to give up its shards, so only an offset beyond the bound by more than that
        # uncertainty counts.
        uncertainty = (after - before) / 2
        self.clock_offset = database_now - (before + uncertainty)
        if corrected is not None and corrected.steps == steps:  # a step in between spoils the sample
            corrected.measured(self.clock_offset, uncertainty)
        self._metrics.clock_offset.set(self.clock_offset.total_seconds())
        eligible = abs(self.clock_offset) - uncertainty <= self._max_clock_offset
        note = "" if eligible else (
            f"clock offset to the database {self.clock_offset.total_seconds() * 1000:+.0f} ms exceeds "
            f"the bound of {self._max_clock_offset.total_seconds() * 1000:.0f} ms: owning no shards"
        )
        if note != self.note:
            (log.warning if note else log.info)(note or "clock offset back within bounds: owning shards again")
            self.note = note
        me = NodeInfo(
            node_id=self._node_id, address=self._address, started_at=before, heartbeat_at=before,
            clock_offset_ms=self.clock_offset.total_seconds() * 1000, shards_owned=len(self._leases),
            workers=self._workers(), eligible=eligible, note=note,
        )
        live = await self._store.shards.heartbeat_node(me, self._ttl)
        share = fair_share(self._node_id, live, await self._store.shard_count())
        await self._watch_for_changes(live)
        if share != self._share:
            log.info("fair share is now %d shards (%d live eligible nodes)", share,
                     sum(1 for node in live if node.eligible))
            self._share = share

    async def _watch_for_changes(self, live: Sequence[NodeInfo]) -> None:
        """Note when the next change of ownership can happen, so the next cycle runs right then
        instead of up to a third of a TTL later: when a node that has missed a heartbeat will
        count as gone, or when the lease of a shard owned by a gone node runs out."""
        database_now = self._clock.now() + self._to_database_time
        interval = self._ttl / 3
        moments = [
            node.heartbeat_at + self._ttl
            for node in live
            if node.node_id != self._node_id and database_now - node.heartbeat_at > interval * 1.5
        ]
        if self._share > len(self._leases):
            live_ids = {node.node_id for node in live}
            moments += [
                shard.lease_expires_at
                for shard in await self._store.shards.list_shards()
                if shard.lease_expires_at is not None and shard.owner and (
                    shard.owner not in live_ids
                    # Dropped here while the database was out of reach, but not yet expired there.
                    or (shard.owner == self._node_id and shard.shard_id not in self._leases)
                )
            ]
        self._next_change_at = min(moments) - self._to_database_time if moments else None

    @property
    def _to_database_time(self) -> timedelta:
        """What turns this node's clock into the database's: nothing for a corrected clock."""
        return timedelta(0) if isinstance(self._clock, CorrectedClock) else self.clock_offset

    def _until_next_cycle(self, interval: float) -> float:
        if self._next_change_at is None:
            return interval
        wait = (self._next_change_at - self._clock.now()).total_seconds() + CHANGE_SLACK
        return min(interval, max(wait, 0.01))

    async def _release_excess(self) -> None:
        """Give back shards above the fair share, highest ids first, so joining nodes get work."""
        excess = sorted(self._leases, reverse=True)[: max(len(self._leases) - self._share, 0)]
        if not excess:
            return
        leases = [self._leases[shard_id] for shard_id in excess]
        self._drop(excess, "rebalance", "rebalancing: above this node's fair share")  # stops firing them first
        await self._store.shards.release_shards(leases)

    async def _acquire(self) -> None:
        await self._follow_server()  # the cycle's calls so far may have found another server
        missing = self._share - len(self._leases)
        if missing <= 0:
            return
        started = self._monotonic()
        acquired = await self._store.shards.acquire_shards(self._node_id, self._ttl, limit=missing)
        if not acquired:
            return
        if not self._leases:
            # Nothing was owned before: these leases start the local deadline. Otherwise the
            # deadline of the renewal just before is earlier, hence the conservative one.
            self._hold_until(started)
        for lease in acquired:
            self._leases[lease.shard_id] = lease
        self._metrics.shards_owned.set(len(self._leases))
        log.info("acquired %d shards (tokens %s)", len(acquired), _tokens(acquired))
        # Rebuilding a large window takes a while; renewals must not wait behind it.
        task = asyncio.create_task(self._rebuild(acquired), name="shard-rebuild")
        self._rebuilds.add(task)
        task.add_done_callback(self._rebuilds.discard)

    async def _rebuild(self, leases: Sequence[ShardLease]) -> None:
        try:
            await self._listener.acquired(leases)
            self._rebuilds.discard(asyncio.current_task())
            if self._owns_share_built():
                self._ready.set()
        except Exception as error:
            # A half-built window would fire some jobs and silently not others: give the
            # shards back so this node or another rebuilds them from scratch. A bug (not a
            # FastlaneError) gets its traceback logged, but is handled the same way: the
            # rebuild runs in a task of its own, where nothing else would see it.
            log.warning("window rebuild of %d shards failed, releasing them: %s", len(leases), error,
                        exc_info=None if isinstance(error, FastlaneError) else error)
            owned = [lease for lease in leases if self._leases.get(lease.shard_id) == lease]
            self._drop([lease.shard_id for lease in owned], "rebuild_failed", "window rebuild failed")
            with contextlib.suppress(StorageError):
                await self._store.shards.release_shards(owned)

    async def _renew(self) -> None:
        await self._follow_server()
        if not self._leases:
            return
        started = self._monotonic()
        asked = dict(self._leases)
        renewed = await self._store.shards.renew_shards(list(asked.values()), self._ttl)
        # Shards dropped while the call was out (the local deadline passed, a fenced write was
        # refused) stay dropped: the lane has forgotten them, so they are acquired afresh.
        still_owned = {lease.shard_id for lease in asked.values() if self._leases.get(lease.shard_id) == lease}
        kept = {lease.shard_id for lease in renewed}
        lost = [shard_id for shard_id in still_owned if shard_id not in kept]
        self._leases = {lease.shard_id: lease for lease in renewed if lease.shard_id in still_owned}
        self._hold_until(started)
        if lost:
            self._drop(lost, "not_renewed", "lease not renewed (taken over or expired)")

    async def _follow_server(self) -> None:
        """After a failover, start over: the windows were built from the old server, whose last
        commits the new one may lack. Every shard is dropped and its lease released on the new
        server (where the token still matches: a lease whose token bump was lost is left to
        expire), so this cycle acquires them again, with tokens the old server never handed out,
        and rebuilds the windows from what the new server holds."""
        epoch = self._store.server_epoch
        if epoch == self._server_epoch:
            return
        self._server_epoch = epoch
        self._metrics.database_server_changes.inc()
        leases = list(self._leases.values())
        self._drop(list(self._leases), "server_changed", "the database is another server now (failover)")
        await self._store.shards.release_shards(leases)

    def _hold_until(self, started: float) -> None:
        """A lease call begun at ``started`` (monotonic) succeeded: the leases are safe until
        TTL less the margin after it, and a timer drops them then unless renewed before."""
        self._valid_until = started + self._ttl.total_seconds() - self._margin
        self._arm_expiry()

    def _arm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        # At least a millisecond: the deadline is exclusive, and a clock that stands still
        # (an injected one) must not spin the loop.
        delay = max(self._valid_until - self._monotonic(), 0.001)
        self._expiry = asyncio.get_running_loop().call_later(delay, self._deadline_reached)

    def _deadline_reached(self) -> None:
        self._expiry = None
        if self._stopping.is_set() or not self._leases:
            return
        if self._monotonic() > self._valid_until:
            self._expire_locally()
        else:  # renewed meanwhile, or the timer ran a hair early
            self._arm_expiry()

    def _expire_locally(self) -> None:
        if self._leases and self._monotonic() > self._valid_until:
            self._drop(list(self._leases), "local_expiry", "could not renew before the lease would expire")

    def lost(self, shard_id: int, token: int, reason: str) -> None:
        """A fenced write with ``token`` was refused. If that is still the lease owned, it is gone."""
        self._metrics.fence_rejections.inc()
        lease = self._leases.get(shard_id)
        if lease is not None and lease.token == token:
            self._drop([shard_id], "fence_rejected", reason)

    def _drop(self, shard_ids: Sequence[int], cause: str, reason: str) -> None:
        """Forget shards at once; ``cause`` labels the metric, ``reason`` goes to the log."""
        if not shard_ids:
            return
        for shard_id in shard_ids:
            self._leases.pop(shard_id, None)
        self._metrics.shards_owned.set(len(self._leases))
        self._metrics.shards_lost.labels(cause=cause).inc(len(shard_ids))
        log.warning("lost %d shards %s: %s", len(shard_ids), sorted(shard_ids)[:10], reason)
        self._listener.lost(shard_ids)

    async def stop(self) -> None:
        """Stop renewing, release every lease and leave the cluster, so successors take over at once.

        Waits for a lease cycle under way to end first (at most a third of the TTL), so that what it
        acquires is released too."""
        self._stopping.set()
        async with self._cycle:
            await self._release_all()

    async def _release_all(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for task in list(self._rebuilds):
            task.cancel()
        leases, self._leases = list(self._leases.values()), {}
        self._metrics.shards_owned.set(0)
        with contextlib.suppress(StorageError):
            if leases:
                await asyncio.shield(self._store.shards.release_shards(leases))
                log.info("released %d shards", len(leases))
            await asyncio.shield(self._store.shards.remove_node(self._node_id))


def _tokens(leases: Sequence[ShardLease]) -> str:
    tokens = sorted({lease.token for lease in leases})
    return f"{tokens[0]}..{tokens[-1]}" if len(tokens) > 1 else str(tokens[0])
