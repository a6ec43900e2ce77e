"""Turning a bearer token into a :class:`~fastlane.auth.caller.Caller`, cheaply on every call.

A token's row is read from the store once and kept for :data:`CACHE_SECONDS`; within that time
each call costs one hash of the presented secret (microseconds). So a token revoked on any node
stops working on every node within that time, and an open worker stream, which re-checks its
token as often (:mod:`fastlane.server.access`), is ended as quickly.

When the database cannot be reached, a token read less than :data:`STALE_GRACE_SECONDS` ago is
still accepted: a short database outage must not lock every worker and client out, and a
revocation made meanwhile could not have been committed anyway. An unknown or never-read token is
answered UNAVAILABLE then, not UNAUTHENTICATED: the caller should retry, not give up.

Last use is written back in batches every few seconds (:meth:`Authenticator.run`), never on the
call's path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fastlane.auth import secrets
from fastlane.auth.caller import Caller
from fastlane.domain.access import ApiToken
from fastlane.domain.errors import StorageError, StorageUnavailable, Unauthenticated
from fastlane.storage import Store

log = logging.getLogger("fastlane.auth")

CACHE_SECONDS = 2.0
STALE_GRACE_SECONDS = 60.0
UNKNOWN_CACHE_SECONDS = 1.0  # an unknown id is not looked up again at once (a flood of bad tokens)
TOUCH_EVERY_SECONDS = 5.0
MAX_CACHED = 10_000
BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class _Cached:
    token: ApiToken | None  # None: no such token
    secret_hash: bytes
    read_at: float  # monotonic seconds


class Authenticator:
    """Checks bearer tokens against the store, with a short cache.

    Args:
        store: Where tokens live.
        now: The wall clock that judges expiry (the node's).
        monotonic: The clock of the cache.
    """

    def __init__(
        self,
        store: Store,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        cache_seconds: float = CACHE_SECONDS,
    ) -> None:
        self._store = store
        self._now = now
        self._monotonic = monotonic
        self._cache_seconds = cache_seconds
        self._cache: dict[str, _Cached] = {}
        self._used: dict[str, datetime] = {}

    async def authenticate(self, authorization: str | None) -> Caller:
        """The caller behind an ``authorization`` metadata value.

        Raises:
            Unauthenticated: missing, malformed, unknown, expired or revoked.
            StorageUnavailable: the token could not be checked (the database is unreachable).
        """
        if not authorization:
            raise Unauthenticated("this node requires a token: send 'authorization: Bearer <token>' "
                                  "(fastlane: FASTLANE_TOKEN or --token-file)")
        if not authorization[:len(BEARER)].lower() == BEARER:
            raise Unauthenticated("the authorization metadata must read 'Bearer <token>'")
        presented = secrets.parse(authorization[len(BEARER):])
        if presented is None:
            raise Unauthenticated("the bearer token is not a fastlane token (fl_<id>_<secret>)")
        cached = await self._lookup(presented.token_id)
        if cached.token is None or not secrets.verify(presented, cached.secret_hash):
            raise Unauthenticated(f"token {presented.token_id} is not known")
        now = self._now()
        refusal = cached.token.refusal(now)
        if refusal is not None:
            raise Unauthenticated(refusal)
        self._used[presented.token_id] = now
        token = cached.token
        return Caller(token_id=token.token_id, name=token.name, tenant=token.tenant, role=token.role)

    async def still_valid(self, caller: Caller) -> str | None:
        """Why an established caller's token may no longer be used (revoked, expired, deleted),
        or None: for streams that outlive a call's check."""
        if caller.token_id is None:
            return None
        try:
            cached = await self._lookup(caller.token_id)
        except StorageUnavailable:
            return None  # judged again on the next check
        if cached.token is None:
            return f"token {caller.token_id} is not known"
        return cached.token.refusal(self._now())

    async def _lookup(self, token_id: str) -> _Cached:
        now = self._monotonic()
        cached = self._cache.get(token_id)
        fresh_for = self._cache_seconds if cached is None or cached.token is not None else UNKNOWN_CACHE_SECONDS
        if cached is not None and now - cached.read_at < fresh_for:
            return cached
        try:
            found = await self._store.tokens.find_token(token_id)
        except StorageError as error:
            if cached is not None and cached.token is not None and now - cached.read_at < STALE_GRACE_SECONDS:
                return cached
            raise StorageUnavailable(f"cannot check the token now: {error}") from error
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()  # rare: as many distinct tokens as this within seconds
        entry = _Cached(found[0], found[1], now) if found else _Cached(None, b"", now)
        self._cache[token_id] = entry
        return entry

    async def run(self, stopping: asyncio.Event) -> None:
        """Write tokens' last use every few seconds until ``stopping`` is set (then once more)."""
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), TOUCH_EVERY_SECONDS)
            except TimeoutError:
                pass
            await self.flush_last_used()

    async def flush_last_used(self) -> None:
        used, self._used = self._used, {}
        if not used:
            return
        try:
            await self._store.tokens.touch_tokens(used)
        except StorageError as error:  # only a record of use: the next flush carries it
            log.warning("could not record the last use of %d tokens: %s", len(used), error)
            for token_id, at in used.items():
                self._used.setdefault(token_id, at)
