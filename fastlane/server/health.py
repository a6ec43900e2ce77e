"""Readiness that follows the database: the node's ``health`` service."""

from __future__ import annotations

import asyncio
import logging

from fastlane.engine.shards import ShardOwnership
from fastlane.runtime.metrics import Metrics
from fastlane.server.grpc_server import ApiServer
from fastlane.storage import Store

log = logging.getLogger("fastlane.node")


class HealthReporter:
    """A node that cannot reach the database (so cannot renew its leases, and fires nothing) says
    NOT_SERVING until it can again; so does one whose SQLite file cannot be written (a full disk, a
    read-only file), at once and with one ERROR line naming the cause. Restartable: it says the
    current state first."""

    name = "health"

    def __init__(self, server: ApiServer, ownership: ShardOwnership, store: Store, metrics: Metrics) -> None:
        self._server = server
        self._ownership = ownership
        self._store = store
        self._metrics = metrics

    async def run(self) -> None:
        ownership = self._ownership
        faults = self._store if self._store.capabilities.write_faults else None
        fault = faults.write_fault if faults is not None else None
        reachable = ownership.healthy
        await self._set(reachable=reachable, fault=fault)
        while True:
            waits = [asyncio.create_task(ownership.health_changed(reachable), name="health-leases")]
            if faults is not None:
                waits.append(asyncio.create_task(faults.write_fault_changed(fault), name="health-writes"))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            was_serving = reachable and fault is None
            new_fault = faults.write_fault if faults is not None else None
            if new_fault != fault:
                if new_fault is not None:
                    log.error("the database cannot be written: %s; not serving meanwhile", new_fault)
                else:
                    log.info("the database can be written again")
                fault = new_fault
            if ownership.healthy != reachable:
                reachable = ownership.healthy
                if not reachable:
                    log.warning("cannot reach the database: not serving")
            serving = reachable and fault is None
            if serving and not was_serving:
                log.info("database reachable and writable again: serving")
            await self._set(reachable=reachable, fault=fault)

    async def _set(self, *, reachable: bool, fault: str | None) -> None:
        self._metrics.database_writable.set(fault is None)
        await self._server.set_ready(reachable and fault is None)
