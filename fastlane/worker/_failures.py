"""What a worker's log says about handlers that fail: every failure in a line, tracebacks without a flood.

A handler that raises is the first thing an operator looks for in a worker's log. So every failed
attempt gets a summary line at INFO (run, job type, attempt, outcome, error), and its traceback
is logged at WARNING. A job type whose every run fails at a thousand runs a second must not bury
everything else in tracebacks, though: each job type logs :data:`BURST` of them in a row, then
one a second, and the next one logged says how many were left out (each is in the node's history
anyway: ``fastlane runs get`` shows every attempt's traceback).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("fastlane.worker")

BURST = 10  # failures of one job type logged in a row before the rate applies
PER_SECOND = 1.0  # then at most this many a second, per job type
MAX_TRACEBACK = 16_000  # characters of a traceback kept: its end, where the exception and innermost frames are


def format_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as Python prints it, cut to its last :data:`MAX_TRACEBACK` characters."""
    text = "".join(traceback.format_exception(exc)).rstrip("\n")
    return text if len(text) <= MAX_TRACEBACK else "…" + text[-(MAX_TRACEBACK - 1):]


@dataclass(slots=True)
class _Budget:
    left: float
    refilled: float
    left_out: int = 0


class FailureLog:
    """Logs failed attempts within a budget per job type, refilled over time (``now``: a monotonic clock, for tests)."""

    def __init__(self, *, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._budgets: dict[str, _Budget] = {}

    def failed(self, *, job_type: str, run_id: str, attempt: int, outcome: str, error: str,
               traceback_text: str) -> None:
        log.info("run %s (%s, attempt %d) %s: %s", run_id, job_type, attempt, outcome, error)
        budget = self._budget(job_type)
        if budget.left < 1:
            budget.left_out += 1
            return
        budget.left -= 1
        left_out, budget.left_out = budget.left_out, 0
        more = f" ({left_out} tracebacks of {job_type} left out since the last)" if left_out else ""
        log.warning("run %s (%s, attempt %d) %s%s\n%s", run_id, job_type, attempt, outcome, more, traceback_text)

    def _budget(self, job_type: str) -> _Budget:
        now = self._now()
        budget = self._budgets.get(job_type)
        if budget is None:
            budget = self._budgets[job_type] = _Budget(left=BURST, refilled=now)
        else:
            budget.left = min(BURST, budget.left + (now - budget.refilled) * PER_SECOND)
            budget.refilled = now
        return budget
