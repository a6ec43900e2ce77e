"""How often one address may try to sign in to the console: a token bucket per source address.

Each source (the connection's peer address) has :data:`BURST` attempts, and gets one back every
:data:`REFILL_SECONDS`, up to the burst again. Every attempt takes one, whether its token is
right or wrong: a valid token gains nothing from signing in faster, and counting all keeps the
rule one sentence. An attempt with none left is answered 429 with ``Retry-After`` before its
token is looked up. Behind a reverse proxy every browser has the proxy's address, so they share
one bucket.

Memory is bounded: at most :data:`MAX_SOURCES` addresses are remembered, the least recently seen
forgotten first (a forgotten address starts again with a full bucket).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

# Ten is more than a person mistyping or pasting the wrong token needs; one every six seconds
# (ten a minute) after that makes guessing a token's secret (256 bits) hopeless, and a flood of
# sign-ins slow, while a person who got it wrong waits seconds, not minutes.
BURST = 10
REFILL_SECONDS = 6.0
# An address is two floats and a key: this bounds the limiter to a few megabytes.
MAX_SOURCES = 10_000


class SigninLimit:
    """The sign-in attempts left to each source address."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic, burst: int = BURST,
                 refill_seconds: float = REFILL_SECONDS, max_sources: int = MAX_SOURCES) -> None:
        if burst < 1 or refill_seconds <= 0 or max_sources < 1:
            raise ValueError("a sign-in limit needs a burst and sources of at least 1 and a positive refill")
        self._monotonic = monotonic
        self._burst = float(burst)
        self._refill = refill_seconds
        self._max_sources = max_sources
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # source: (attempts left, as of)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, source: str) -> float:
        """Take one attempt for ``source``: 0.0 if it may go ahead, else the seconds until it may."""
        now = self._monotonic()
        left, since = self._buckets.pop(source, (self._burst, now))
        left = min(self._burst, left + (now - since) / self._refill)
        if left >= 1.0:
            left -= 1.0
            wait = 0.0
        else:
            wait = (1.0 - left) * self._refill
        self._buckets[source] = (left, now)
        while len(self._buckets) > self._max_sources:
            self._buckets.popitem(last=False)
        return wait
