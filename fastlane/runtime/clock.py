"""Time, injectable.

All datetimes inside fastlane are timezone-aware UTC. Code that needs "now" takes a :class:`Clock`
so tests can control time without patching :mod:`datetime`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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


# A step is a change of the wall clock against the monotonic one of more than this between two
# readings, plus SLEW_TOLERANCE of the time between them: NTP slews a clock by at most 500 ppm,
# and a reading an hour after the last may differ by that much without any step.
STEP_BOUND_NS = 20_000_000
SLEW_TOLERANCE = 1 / 1_000
OFFSET_SAMPLES = 8  # measurements of the offset kept; the one with the shortest round trip counts
# An offset this much beyond its own uncertainty is taken for a real one; a smaller one cannot be
# told from clocks that agree (NTP keeps hosts well within it), and correcting by it would only add
# the measurement's noise to every firing.
OFFSET_DEADBAND_NS = 1_000_000


class StepWatch:
    """Reads the wall clock and tells how far it stepped, against the monotonic clock, since the
    last reading: 0 unless by more than :data:`STEP_BOUND_NS` plus :data:`SLEW_TOLERANCE` of the
    time between the readings."""

    __slots__ = ("_wall_ns", "_monotonic_ns", "_last_wall", "_last_monotonic")

    def __init__(self, *, wall_ns: Callable[[], int] = time.time_ns,
                 monotonic_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._wall_ns = wall_ns
        self._monotonic_ns = monotonic_ns
        self._last_monotonic = monotonic_ns()
        self._last_wall = wall_ns()

    def read(self) -> tuple[int, int]:
        """(the wall clock now, ns; how far it stepped since the last reading, ns, or 0)."""
        # The wall clock read between two monotonic readings: a thread preempted in between would
        # otherwise pass the pause for a step. A reading that took too long to bracket judges nothing.
        before, wall, after = self._monotonic_ns(), self._wall_ns(), self._monotonic_ns()
        if after - before > STEP_BOUND_NS // 4:
            return wall, 0
        monotonic = (before + after) // 2
        elapsed = monotonic - self._last_monotonic
        jump = (wall - self._last_wall) - elapsed
        self._last_wall, self._last_monotonic = wall, monotonic
        return wall, (jump if abs(jump) > STEP_BOUND_NS + elapsed * SLEW_TOLERANCE else 0)


class CorrectedClock:
    """This host's wall clock corrected to a reference clock (the database's, which judges every
    lease) by a measured offset, and watched for steps.

    ``now()`` is the wall clock plus the offset, so every node fires on the reference's instant
    rather than on its own. Each reading is compared with the monotonic clock: when the wall clock
    jumps (set by hand, a VM resumed, a bad NTP step), the offset takes the jump back at once, so
    corrected time goes on as the monotonic clock does: nothing due inside a forward jump looks
    due, and nothing passed before a backward jump looks due again. ``on_step`` hears of it (the
    node counts and logs it, and measures the offset again at once).
    """

    def __init__(
        self,
        *,
        wall_ns: Callable[[], int] = time.time_ns,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        on_step: Callable[[int], None] = lambda jump_ns: None,
    ) -> None:
        self._watch = StepWatch(wall_ns=wall_ns, monotonic_ns=monotonic_ns)
        self.on_step = on_step
        self.offset_ns = 0  # reference minus wall clock
        self.steps = 0
        self._samples: list[tuple[int, int]] = []  # (offset, uncertainty) ns, oldest first

    def now_ns(self) -> int:
        wall, jump = self._watch.read()
        if jump:
            self.offset_ns -= jump
            self._samples = [(offset - jump, uncertainty) for offset, uncertainty in self._samples]
            self.steps += 1
            self.on_step(jump)
        return wall + self.offset_ns

    def now(self) -> datetime:
        return from_micros(self.now_ns() // 1000)

    def wall_now(self) -> datetime:
        """This host's wall clock as it is, uncorrected (what the offset is measured against)."""
        return from_micros((self.now_ns() - self.offset_ns) // 1000)

    @property
    def offset(self) -> timedelta:
        return timedelta(microseconds=self.offset_ns // 1000)

    def measured(self, offset: timedelta, uncertainty: timedelta) -> None:
        """Take one measurement of the offset (reference minus wall clock, right to within
        ``uncertainty``). The most certain of the recent ones counts: within
        :data:`OFFSET_DEADBAND_NS` of its uncertainty of zero, the clocks agree as far as anyone
        can tell and the wall clock is used as it is; beyond, the offset in force is the lowest
        the measurement allows (offset minus uncertainty), so corrected time is never ahead of the
        reference: a run may start up to twice the uncertainty late, never early."""
        self._samples = [*self._samples[1 - OFFSET_SAMPLES:], (_ns(offset), _ns(uncertainty))]
        best, spread = min(reversed(self._samples), key=lambda sample: sample[1])
        self.offset_ns = 0 if abs(best) <= spread + OFFSET_DEADBAND_NS else best - spread


def _ns(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


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
