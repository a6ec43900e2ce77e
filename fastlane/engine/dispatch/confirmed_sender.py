"""Runs sent only once their dispatch is durable: at-most-once runs, runs read back from the
database, and runs with a concurrency key, whose dispatch also claims a place under the key's
cap (see :mod:`.key_gate`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, MutableMapping

from fastlane.domain.errors import StorageError
from fastlane.domain.records import CappedDispatches
from fastlane.engine.dispatch.journal import write_isolating
from fastlane.engine.dispatch.key_gate import KeyGate
from fastlane.engine.dispatch.messages import Assign, Assigned, AttemptKey, WorkerSession
from fastlane.storage import Dispatch, Store

log = logging.getLogger("fastlane.dispatch")


class ConfirmedSender:
    def __init__(
        self,
        store: Store,
        *,
        claimed: set[str],
        in_flight: MutableMapping[AttemptKey, WorkerSession],
        gate: KeyGate,
        record: Callable[[WorkerSession, Assigned], Dispatch],
        rejected: Callable[[Dispatch, Exception], None],
        credits_back: Callable[[WorkerSession], None],
    ) -> None:
        self._store = store
        self._claimed = claimed  # shared with the dispatcher (see Dispatcher.__init__)
        self._in_flight = in_flight
        self._gate = gate
        self._record = record
        self._rejected = rejected  # a dispatch that makes the store raise is set aside
        self._credits_back = credits_back  # credits of runs not sent may take other ready runs
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, session: WorkerSession, assigned: list[Assigned]) -> None:
        task = asyncio.create_task(self._send(session, assigned), name="dispatch-confirmed")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, session: WorkerSession, assigned: list[Assigned]) -> None:
        started: set[str] = set()
        blocked: set[str] = set()

        def landed(_: list[Dispatch], outcome: CappedDispatches) -> None:
            started.update(attempt.run_id for attempt in outcome.attempts)
            blocked.update(outcome.blocked)

        records = [self._record(session, item) for item in assigned]
        plain, capped = [r for r in records if r.cap is None], [r for r in records if r.cap is not None]
        try:
            if plain:
                await write_isolating(plain, self._plain, landed=landed, rejected=self._rejected)
            if capped:
                await write_isolating(capped, self._store.attempts.record_capped_dispatches, landed=landed,
                                      rejected=self._rejected)
        except StorageError as error:
            # Still scheduled in the database: the next rebuild or sweep brings them back.
            log.warning("could not record %d dispatches before sending; not sent: %s", len(assigned), error)
        for item in assigned:
            self._claimed.discard(item.run.run_id)
            if item.run.run_id not in started:
                # Already taken by another attempt, blocked by its key, or the write failed: never sent twice.
                self._in_flight.pop((item.run.run_id, item.lease_token), None)
                session.credits += 1
        sendable = [item for item in assigned if item.run.run_id in started]
        self._gate.started([(item.run.run_id, item.lease_token) for item in sendable if item.run.concurrency_key])
        self._gate.block([item.run for item in assigned if item.run.run_id in blocked])
        if sendable and session.connected:
            session.outbox.put_nowait(Assign(sendable))
        if len(sendable) < len(assigned) and session.connected:
            self._credits_back(session)

    async def _plain(self, dispatches: list[Dispatch]) -> CappedDispatches:
        return CappedDispatches(await self._store.attempts.record_dispatches(dispatches), [])
