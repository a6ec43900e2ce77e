"""Runs sent only once their dispatch is durable: at-most-once runs, runs read back from the
database, and runs with a concurrency key, whose dispatch also claims a place under the key's
cap (see :mod:`.key_gate`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import Protocol

from fastlane.domain.errors import StorageError
from fastlane.domain.records import CappedDispatches
from fastlane.engine.dispatch.journal import write_isolating
from fastlane.engine.dispatch.key_gate import KeyGate
from fastlane.engine.dispatch.messages import Assign, Assigned, AttemptKey, WorkerSession
from fastlane.storage import Dispatch, Store

log = logging.getLogger("fastlane.dispatch")


class SenderDispatcher(Protocol):
    """What sending confirmed first needs of the dispatcher: the dispatch of each assignment, where
    to set aside one the store refuses, and the ready runs the credits of runs not sent may take."""

    def dispatch_of(self, session: WorkerSession, item: Assigned) -> Dispatch:
        """The durable record of this assignment."""
        ...

    def set_aside(self, dispatch: Dispatch, error: Exception) -> None:
        """This dispatch makes the store raise: not recorded (the run stays ``scheduled``)."""
        ...

    def assign_ready(self, session: WorkerSession) -> None:
        """Assign ready runs to the session's free credits (those of runs not sent came back)."""
        ...


class ConfirmedSender:
    def __init__(
        self,
        store: Store,
        *,
        claimed: set[str],
        in_flight: MutableMapping[AttemptKey, WorkerSession],
        gate: KeyGate,
        dispatcher: SenderDispatcher,
    ) -> None:
        self._store = store
        self._claimed = claimed  # shared with the dispatcher (see Dispatcher.__init__)
        self._in_flight = in_flight
        self._gate = gate
        self._dispatcher = dispatcher
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

        records = [self._dispatcher.dispatch_of(session, item) for item in assigned]
        plain, capped = [r for r in records if r.cap is None], [r for r in records if r.cap is not None]
        try:
            if plain:
                await write_isolating(plain, self._plain, landed=landed, rejected=self._dispatcher.set_aside)
            if capped:
                await write_isolating(capped, self._store.attempts.record_capped_dispatches, landed=landed,
                                      rejected=self._dispatcher.set_aside)
        except StorageError as error:
            # Still scheduled in the database: the next rebuild or sweep brings them back.
            log.warning("could not record %d dispatches before sending; not sent: %s", len(assigned), error)
        for item in assigned:
            self._claimed.discard(item.run.run_id)
            if item.run.run_id not in started:
                # Already taken by another attempt, blocked by its key, or the write failed: never sent twice.
                self._in_flight.pop((item.run.run_id, item.lease_token), None)
                if not session.draining:
                    session.credits += 1
        sendable = [item for item in assigned if item.run.run_id in started]
        self._gate.started([(item.run.run_id, item.lease_token) for item in sendable if item.run.concurrency_key])
        self._gate.block([item.run for item in assigned if item.run.run_id in blocked])
        if sendable and session.connected:
            session.outbox.put_nowait(Assign(sendable))
        if len(sendable) < len(assigned) and session.connected:
            self._dispatcher.assign_ready(session)

    async def _plain(self, dispatches: list[Dispatch]) -> CappedDispatches:
        return CappedDispatches(await self._store.attempts.record_dispatches(dispatches), [])
