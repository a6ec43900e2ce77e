"""A clock a test moves by hand: :class:`ManualClock`.

Code that needs "now" takes a :class:`~fastlane.runtime.clock.Clock` (anything with ``now()``),
so a test can put time where it wants it instead of patching :mod:`datetime` or sleeping until
a deadline passes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastlane.runtime.clock import ensure_utc

DEFAULT_START = datetime(2030, 1, 1, tzinfo=UTC)


class ManualClock:
    """A clock that moves only when told; satisfies the ``Clock`` protocol (``now()``).

    Example::

        clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
        clock.advance(timedelta(minutes=5))      # or clock.advance(300), in seconds
        assert clock.now() == datetime(2030, 1, 1, 0, 5, tzinfo=UTC)
    """

    __slots__ = ("_now",)

    def __init__(self, start: datetime = DEFAULT_START) -> None:
        """``start`` must be timezone-aware; it is kept in UTC.

        Raises:
            ValueError: ``start`` is naive.
        """
        self._now = ensure_utc(start)

    def now(self) -> datetime:
        """The instant the clock shows, timezone-aware UTC."""
        return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move the clock by ``delta`` (a timedelta, or seconds; negative steps it back) and
        return the new now."""
        self._now += delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        return self._now

    def set(self, instant: datetime) -> None:
        """Show ``instant`` from now on (it may be earlier: a clock stepped back).

        Raises:
            ValueError: ``instant`` is naive.
        """
        self._now = ensure_utc(instant)

    def __repr__(self) -> str:
        return f"ManualClock({self._now.isoformat()})"
