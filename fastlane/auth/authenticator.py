"""Turning a bearer token into a :class:`~fastlane.auth.caller.Caller`, cheaply on every call.

A token's row is read from the store once and kept for :data:`CACHE_SECONDS`; within that time
each call costs one hash of the presented secret (microseconds). So a token revoked on any node
stops working on every node within that time, and an open worker stream, which re-checks its
token as often (:mod:`fastlane.server.access`), is ended as quickly.

When the database cannot be reached, a token read less than :data:`STALE_GRACE_SECONDS` ago is
still accepted: a short database outage must not lock every worker and client out, and a
revocation made meanwhile could not have been committed anyway. An unknown or never-read token is
answered UNAVAILABLE then, not UNAUTHENTICATED: the caller should retry, not give up.

Ids the store does not know cost it one read, not one per attempt: an unknown id is remembered
for :data:`UNKNOWN_CACHE_SECONDS` (the :data:`MAX_UNKNOWN` latest), and each source (the caller's
address) may have :data:`UNKNOWN_LOOKUP_BURST` ids looked up that turn out unknown, refilled at
:data:`UNKNOWN_LOOKUPS_PER_SECOND`; beyond that an id this node has not seen is refused
UNAUTHENTICATED without a read (a token's first use from that source too, until the budget
refills: a source that presents tokens which exist spends nothing). So guessing or replaying ids
costs the database nothing after the first look, and a probe cannot keep telling a live id
(answered from the cache) from a dead one by how long the answer takes: both are answered from
memory. Remembering an unknown id refuses no token made later: a token's id is drawn at random by
the node that creates it (:mod:`fastlane.auth.secrets`, 62 bits), so no one can have presented it
before it existed, on this node or any other.

Last use is written back in batches every few seconds (:meth:`Authenticator.run`), never on the
call's path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
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
UNKNOWN_CACHE_SECONDS = 30.0  # an id the store did not know is not looked up again within this
MAX_UNKNOWN = 10_000  # unknown ids remembered, the least recently presented forgotten first
UNKNOWN_LOOKUP_BURST = 20  # lookups of ids not seen here, per source, before the rate below applies
UNKNOWN_LOOKUPS_PER_SECOND = 1.0  # per source, once its burst is spent
MAX_SOURCES = 10_000  # sources with a bucket in memory; beyond it the least recent one is dropped
TOUCH_EVERY_SECONDS = 5.0
MAX_CACHED = 10_000
BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class _Cached:
    token: ApiToken | None  # None: no such token
    secret_hash: bytes
    read_at: float  # monotonic seconds


_UNKNOWN = _Cached(None, b"", 0.0)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # monotonic seconds


class _LookupBudget:
    """A token bucket per source for lookups of ids this node has not seen, the
    :data:`MAX_SOURCES` most recent sources kept (a dropped one starts full again). A lookup is
    paid for before the read, so lookups in flight at once cannot overdraw it, and given back when
    the id was a token's: only unknown ids use a source's budget up."""

    def __init__(self, monotonic: Callable[[], float], burst: float, per_second: float) -> None:
        self._monotonic, self._burst, self._per_second = monotonic, burst, per_second
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, source: str) -> bool:
        """Spend one lookup of ``source``'s; False when it has none left."""
        now = self._monotonic()
        bucket = self._buckets.pop(source, None) or _Bucket(self._burst, now)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) * self._per_second)
        bucket.at = now
        self._buckets[source] = bucket
        if len(self._buckets) > MAX_SOURCES:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def give_back(self, source: str) -> None:
        """Return the lookup :meth:`take` spent: the id was a token's."""
        bucket = self._buckets.get(source)
        if bucket is not None:
            bucket.tokens = min(self._burst, bucket.tokens + 1)


class Authenticator:
    """Checks bearer tokens against the store, with a short cache.

    Args:
        store: Where tokens live.
        now: The wall clock that judges expiry (the node's).
        monotonic: The clock of the cache.
        unknown_lookup_burst: Lookups of ids not seen here each source may make at once.
        unknown_lookups_per_second: The rate its burst is refilled at.
    """

    def __init__(
        self,
        store: Store,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        cache_seconds: float = CACHE_SECONDS,
        unknown_lookup_burst: float = UNKNOWN_LOOKUP_BURST,
        unknown_lookups_per_second: float = UNKNOWN_LOOKUPS_PER_SECOND,
    ) -> None:
        self._store = store
        self._now = now
        self._monotonic = monotonic
        self._cache_seconds = cache_seconds
        self._cache: dict[str, _Cached] = {}  # tokens the store has
        self._unknown: OrderedDict[str, float] = OrderedDict()  # ids it did not have: when read
        self._budget = _LookupBudget(monotonic, unknown_lookup_burst, unknown_lookups_per_second)
        self._used: dict[str, datetime] = {}

    async def authenticate(self, authorization: str | None, *, source: str | None = None) -> Caller:
        """The caller behind an ``authorization`` metadata value.

        ``source`` is where the call comes from (the client's address): the lookups of ids this
        node has not seen are limited per source. None: not limited (an in-process caller).

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
        cached = await self._lookup(presented.token_id, source)
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

    async def _lookup(self, token_id: str, source: str | None = None) -> _Cached:
        now = self._monotonic()
        cached = self._cache.get(token_id)
        if cached is not None and now - cached.read_at < self._cache_seconds:
            return cached
        if cached is None:
            unknown_since = self._unknown.get(token_id)
            if unknown_since is not None and now - unknown_since < UNKNOWN_CACHE_SECONDS:
                self._unknown.move_to_end(token_id)
                return _UNKNOWN
            if source is not None and not self._budget.take(source):
                raise Unauthenticated(f"token {token_id} is not known (too many unknown tokens from {source}: "
                                      "try again in a few seconds)")
        else:
            source = None  # a token's row read again: no budget spent
        try:
            found = await self._store.tokens.find_token(token_id)
        except StorageError as error:
            if source is not None:
                self._budget.give_back(source)  # not known to be unknown
            if cached is not None and now - cached.read_at < STALE_GRACE_SECONDS:
                return cached
            raise StorageUnavailable(f"cannot check the token now: {error}") from error
        if not found:
            self._cache.pop(token_id, None)  # deleted meanwhile
            self._unknown.pop(token_id, None)
            self._unknown[token_id] = now
            if len(self._unknown) > MAX_UNKNOWN:
                self._unknown.popitem(last=False)
            return _UNKNOWN
        if source is not None:
            self._budget.give_back(source)
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()  # rare: as many distinct live tokens as this within seconds
        entry = _Cached(found[0], found[1], now)
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
