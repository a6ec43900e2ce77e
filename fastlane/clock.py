"""Time, injectable.

All datetimes inside fastlane are timezone-aware UTC. Code that needs "now" takes a :class:`Clock`
so tests can control time without patching :mod:`datetime`.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""
        ...


class SystemClock:
    """Wall-clock time of this host."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: datetime) -> None:
        self._now = ensure_utc(start)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> None:
        self._now += delta

    def set(self, instant: datetime) -> None:
        self._now = ensure_utc(instant)


def ensure_utc(instant: datetime) -> datetime:
    """Return ``instant`` in UTC; naive datetimes are refused rather than guessed at."""
    if instant.tzinfo is None:
        raise ValueError(f"naive datetime {instant.isoformat()} has no offset; fastlane needs aware datetimes")
    return instant.astimezone(UTC)


def to_micros(instant: datetime) -> int:
    """Microseconds since the Unix epoch: the storage form of an instant in SQLite and on the wire."""
    delta = ensure_utc(instant) - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def loop_deadline(instant: datetime, clock: Clock) -> float:
    """Translate a wall-clock instant into the event loop's monotonic time base."""
    loop = asyncio.get_running_loop()
    return loop.time() + (instant - clock.now()).total_seconds()


def monotonic() -> float:
    return time.monotonic()


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
