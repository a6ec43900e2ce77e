"""Change notification across nodes on PostgreSQL: NOTIFY inside the writing transaction, and
the LISTEN session that hears them, connecting again after a lost connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import cast

from fastlane.domain.errors import StorageUnavailable
from fastlane.domain.records import Change, ChangeKind
from fastlane.runtime.supervise import Backoff
from fastlane.storage import common
from fastlane.storage.driver_errors import POSTGRES_DRIVER_ERRORS, classify_postgres
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.connection import SessionLimits
from fastlane.storage.postgres.hosts import HostRotation
from fastlane.storage.postgres.tx import CHANGES_CHANNEL

log = logging.getLogger("fastlane.storage.postgres")

LISTENER_PING = 10.0  # seconds between liveness checks of the LISTEN connection
LISTENER_BACKOFF = Backoff(first=0.1, cap=2.0)  # between attempts to LISTEN again


class ChangeListener:
    """The change watch of :class:`~fastlane.storage.postgres.database.PostgresDatabase`: one
    LISTEN connection of its own, to the hosts and with the session limits of the pool's."""

    def __init__(self, hosts: HostRotation, limits: SessionLimits, rng: random.Random) -> None:
        self._hosts = hosts
        self._limits = limits
        self._rng = rng

    async def watch(self, on_change: Callable[[Change], None]) -> None:
        """LISTEN for changes until cancelled; after a lost connection, connect and LISTEN again
        with capped, jittered backoff (a restarting database is weather, not an error)."""
        failures = 0
        while True:
            listening_since = time.monotonic()
            try:
                await self._listen_until_lost(on_change)
            except StorageUnavailable as error:
                # A session that lasted was no failure to connect: the backoff starts afresh.
                failures = 1 if time.monotonic() - listening_since > LISTENER_PING else failures + 1
                delay = LISTENER_BACKOFF.delay(failures, self._rng)
                log.warning("change listener: %s (listening again in %.1f s)", error, delay)
                await asyncio.sleep(delay)

    async def _listen_until_lost(self, on_change: Callable[[Change], None]) -> None:
        """One LISTEN session; raises StorageUnavailable once its connection is gone."""

        def deliver(_connection: object, _pid: int, _channel: str, payload: object) -> None:
            # asyncpg hands a NOTIFY payload over as the str it is; its stubs say object.
            change = common.decode_change(cast(str, payload))
            if change is not None:
                on_change(change)

        try:
            # The node's session limits apply here too, harmlessly: LISTEN waits idle *outside* a
            # transaction, which idle_in_transaction_session_timeout leaves alone.
            listener = await self._hosts.connect(timeout=LISTENER_PING, server_settings=self._limits.server_settings())
        except POSTGRES_DRIVER_ERRORS as error:
            raise classify_postgres(error, doing="connecting to listen for changes") from error
        lost = asyncio.Event()
        listener.add_termination_listener(lambda _connection: lost.set())
        try:
            await listener.add_listener(CHANGES_CHANNEL, deliver)
            # Changes missed while (re)connecting are found by the full scan; a members change
            # makes every node look at the cluster again at once (and renew, if it could not).
            on_change(Change(ChangeKind.MEMBERS))
            while not lost.is_set():
                # A server that vanished without closing the socket is found by the ping.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LISTENER_PING):
                        await lost.wait()
                if not lost.is_set():
                    await listener.execute(queries.PING, timeout=LISTENER_PING)
            raise StorageUnavailable("the change listener's connection was closed")
        except POSTGRES_DRIVER_ERRORS as error:
            raise classify_postgres(error, connection_closed=listener.is_closed(), doing="listening") from error
        finally:
            with contextlib.suppress(Exception):
                await listener.close(timeout=2)
