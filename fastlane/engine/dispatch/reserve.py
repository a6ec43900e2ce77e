"""Credits of each worker stream kept for urgent runs (``--priority-reserve PRIORITY=N``).

Priority orders the runs that wait; it cannot free a slot, and with every slot busy an urgent run
that falls due waits for a handler to end. So ordinary runs (below the urgent priority) take at
most a stream's credits less N, never fewer than one; urgent runs take any free credit, and find
one at their instant to be sent ahead on. A stream's credits are counted live, free plus in flight: a
worker that reconnects with runs still going declares only its free ones and grants the others as
those runs end.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastlane.domain.limits import MAX_PRIORITY, MAX_PRIORITY_RESERVE, MIN_PRIORITY
from fastlane.domain.models import Run
from fastlane.engine.dispatch.in_flight import InFlight
from fastlane.engine.dispatch.messages import WorkerSession
from fastlane.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class PriorityReserve:
    """Credits of every worker stream kept for urgent runs (``--priority-reserve PRIORITY=N``).

    Runs of priority below ``priority`` hold at most a stream's credits less ``credits`` (at least
    one, so a small worker still takes them); runs of ``priority`` or more take any free credit.
    So urgent runs find a free credit (and are sent ahead, to start on their instant) however
    large the backlog of the others, as long as no more than ``credits`` of them run at once.
    """

    priority: int
    credits: int

    def validate(self) -> None:
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise ConfigurationError(
                f"--priority-reserve priority {self.priority} is out of range ({MIN_PRIORITY}..{MAX_PRIORITY})")
        if not 1 <= self.credits <= MAX_PRIORITY_RESERVE:
            raise ConfigurationError(
                f"--priority-reserve credits {self.credits} are out of range (1..{MAX_PRIORITY_RESERVE})")


class Reserve:
    """The reserve of one node (``settings`` None: nothing is kept, every run may take any credit)."""

    def __init__(self, settings: PriorityReserve | None, in_flight: InFlight) -> None:
        self._settings = settings
        self._in_flight = in_flight

    def __bool__(self) -> bool:
        return self._settings is not None

    @property
    def urgent_priority(self) -> int | None:
        """The priority from which runs are urgent; None without a reserve."""
        return None if self._settings is None else self._settings.priority

    def ordinary(self, run: Run) -> bool:
        """Whether ``run`` is limited to the stream's credits less the reserve."""
        return self._settings is not None and run.priority < self._settings.priority

    def ordinary_room(self, session: WorkerSession) -> bool:
        """Whether ``session`` may take one more ordinary run (always, without a reserve)."""
        if self._settings is None:
            return True
        credits = session.credits + self._in_flight.counted(session)
        return self._in_flight.ordinary_count(session) < max(credits - self._settings.credits, 1)
