"""Shard ownership: acquire leases, renew them in time, and give them up.

A node owns a shard only while it has renewed the lease in time. Renewal is judged by the
database; locally the node keeps a conservative deadline (measured from *before* the renew
call, minus a margin) and :meth:`ShardOwnership.fence` stops answering for a shard the moment
that deadline passes, so the node stops firing before any other node can take the shard over —
even if the renewal itself is stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

from fastlane.errors import FastlaneError, StorageError
from fastlane.metrics import Metrics
from fastlane.models import ShardLease
from fastlane.storage import Store

log = logging.getLogger("fastlane.shards")

ShardsAcquired = Callable[[Sequence[ShardLease]], Awaitable[None]]
ShardsLost = Callable[[Sequence[int]], None]


class ShardOwnership:
    """Keeps this node's shard leases alive and tells the fast lane what it gained or lost."""

    def __init__(
        self,
        store: Store,
        *,
        node_id: str,
        ttl: timedelta,
        metrics: Metrics,
        on_acquired: ShardsAcquired,
        on_lost: ShardsLost,
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._ttl = ttl
        self._metrics = metrics
        self._on_acquired = on_acquired
        self._on_lost = on_lost
        self._leases: dict[int, ShardLease] = {}
        self._valid_until = 0.0  # monotonic deadline of the last successful renewal, less a margin
        # The database may judge expiry a little before our monotonic clock does.
        self._margin = min(1.0, ttl.total_seconds() / 10)
        self._stopping = asyncio.Event()
        self._rebuilds: set[asyncio.Task[None]] = set()
        self._ready = asyncio.Event()  # set once the first windows are built

    @property
    def leases(self) -> dict[int, ShardLease]:
        return self._leases

    def fence(self, shard_id: int) -> ShardLease | None:
        """The lease to fence writes for ``shard_id`` with, or None if this node may not act for it."""
        if time.monotonic() > self._valid_until:
            return None
        return self._leases.get(shard_id)

    def owned(self) -> list[int]:
        if time.monotonic() > self._valid_until:
            return []
        return sorted(self._leases)

    async def target_share(self) -> int:
        """How many shards this node should hold. A single node holds them all."""
        return await self._store.shard_count()

    async def run(self, ready: asyncio.Event) -> None:
        """Acquire, then renew every third of the TTL until stopped. ``ready`` is set once the
        windows of the shards first acquired are built."""
        self._ready = ready
        interval = self._ttl.total_seconds() / 3
        while not self._stopping.is_set():
            try:
                async with asyncio.timeout(interval):
                    await self._renew()
                    await self._acquire()
                if not self._rebuilds:
                    ready.set()
            except (StorageError, TimeoutError) as error:
                log.warning("shard lease upkeep failed: %s", error or "timed out")
            self._expire_locally()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._stopping.wait()

    async def _acquire(self) -> None:
        missing = await self.target_share() - len(self._leases)
        if missing <= 0:
            return
        started = time.monotonic()
        acquired = await self._store.acquire_shards(self._node_id, self._ttl, limit=missing)
        if not acquired:
            return
        if not self._leases:
            # Nothing was held before: these leases start the local deadline. Otherwise the
            # deadline of the renewal just before is earlier, hence the conservative one.
            self._valid_until = started + self._ttl.total_seconds() - self._margin
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
            await self._on_acquired(leases)
            if len(self._rebuilds) <= 1:  # only this one
                self._ready.set()
        except FastlaneError as error:
            # A half-built window would fire some jobs and silently not others: give the
            # shards back so this node or another rebuilds them from scratch.
            log.warning("window rebuild of %d shards failed, releasing them: %s", len(leases), error)
            held = [lease for lease in leases if self._leases.get(lease.shard_id) == lease]
            self._drop([lease.shard_id for lease in held], "window rebuild failed")
            with contextlib.suppress(StorageError):
                await self._store.release_shards(held)

    async def _renew(self) -> None:
        if not self._leases:
            return
        started = time.monotonic()
        renewed = await self._store.renew_shards(list(self._leases.values()), self._ttl)
        kept = {lease.shard_id for lease in renewed}
        lost = [shard_id for shard_id in self._leases if shard_id not in kept]
        self._leases = {lease.shard_id: lease for lease in renewed}
        self._valid_until = started + self._ttl.total_seconds() - self._margin
        if lost:
            self._drop(lost, "lease not renewed (taken over or expired)")

    def _expire_locally(self) -> None:
        if self._leases and time.monotonic() > self._valid_until:
            self._drop(list(self._leases), "could not renew before the lease would expire")

    def lost(self, shard_id: int, token: int, reason: str) -> None:
        """A fenced write with ``token`` was refused. If that is still the lease held, it is gone."""
        self._metrics.fence_rejections.inc()
        lease = self._leases.get(shard_id)
        if lease is not None and lease.token == token:
            self._drop([shard_id], reason)

    def _drop(self, shard_ids: Sequence[int], reason: str) -> None:
        if not shard_ids:
            return
        for shard_id in shard_ids:
            self._leases.pop(shard_id, None)
        self._metrics.shards_owned.set(len(self._leases))
        log.warning("lost %d shards %s: %s", len(shard_ids), sorted(shard_ids)[:10], reason)
        self._on_lost(shard_ids)

    async def stop(self) -> None:
        """Stop renewing and release every lease so a successor can take over at once."""
        self._stopping.set()
        for task in list(self._rebuilds):
            task.cancel()
        leases, self._leases = list(self._leases.values()), {}
        self._metrics.shards_owned.set(0)
        if leases:
            with contextlib.suppress(StorageError):
                await asyncio.shield(self._store.release_shards(leases))
            log.info("released %d shards", len(leases))


def _tokens(leases: Sequence[ShardLease]) -> str:
    tokens = sorted({lease.token for lease in leases})
    return f"{tokens[0]}..{tokens[-1]}" if len(tokens) > 1 else str(tokens[0])
