"""Supervision of a node's long-lived loops (after Erlang/OTP's one-for-one supervisor).

A loop that raises is started again after a capped, jittered backoff, and the node goes on:

- :class:`StorageUnavailable` (alone, or every exception of a group) is weather: the database is
  restarting or out of reach. It is logged as a warning, never counted as a failure, and never a
  reason to give up.
- Any other exception is a failure of the loop itself: logged with its traceback, counted in
  ``fastlane_loop_failures_total{loop}``, restarted. A loop that keeps failing the moment it
  starts (``give_up_after`` times in a row) cannot go on: :class:`LoopGaveUp` tells the node to
  stop and say why.

A loop that returns has finished its work; so has one that fails once ``stop`` is set (the node
is shutting down and nothing would use it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastlane.domain.errors import StorageUnavailable
from fastlane.errors import FastlaneError
from fastlane.runtime.metrics import Metrics

log = logging.getLogger("fastlane.supervise")

HEALTHY_RUN = 30.0  # seconds: a loop that ran this long before failing starts afresh
GIVE_UP_AFTER = 10  # unexpected failures in a row before the node gives up


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Exponential backoff with jitter: about ``first``, twice that, and so on up to ``cap`` seconds."""

    first: float = 0.1
    cap: float = 5.0

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait after ``failures`` failures in a row (1 for the first).

        Each wait is drawn between half its step and the whole step ("equal jitter"): nodes that
        failed together do not retry together, yet none hammers the database with near-zero waits.
        """
        step = min(self.cap, self.first * 2.0 ** min(max(failures - 1, 0), 32))
        return step / 2 + (rng or random).uniform(0, step / 2)


class LoopGaveUp(FastlaneError):
    """A background loop failed too many times in a row: the node cannot go on."""

    def __init__(self, loop: str, failures: int, last: BaseException) -> None:
        self.loop = loop
        self.failures = failures
        super().__init__(
            f"background loop {loop!r} failed {failures} times in a row, last with "
            f"{type(last).__name__}: {last}; see the log for each traceback"
        )


def is_weather(error: BaseException) -> bool:
    """Whether ``error`` only says the database is out of reach (every leaf, for a group)."""
    if isinstance(error, BaseExceptionGroup):
        return all(is_weather(inner) for inner in error.exceptions)
    return isinstance(error, StorageUnavailable)


async def supervised(
    name: str,
    make_loop: Callable[[], Awaitable[None]],
    *,
    metrics: Metrics,
    stop: asyncio.Event,
    backoff: Backoff = Backoff(),
    give_up_after: int | None = None,
) -> None:
    """Run ``make_loop()`` until it returns, restarting it with backoff whenever it raises.

    ``give_up_after`` defaults to :data:`GIVE_UP_AFTER`.

    Raises:
        LoopGaveUp: It failed unexpectedly ``give_up_after`` times in a row.
    """
    failures = 0  # in a row, weather included: sets the backoff
    crashes = 0  # unexpected failures in a row: decides giving up
    limit = GIVE_UP_AFTER if give_up_after is None else give_up_after
    while True:
        started = time.monotonic()
        try:
            await make_loop()
            return
        except Exception as error:  # an ExceptionGroup from a loop's own task group too
            if time.monotonic() - started >= HEALTHY_RUN:
                failures = crashes = 0
            failures += 1
            delay = backoff.delay(failures)
            if is_weather(error):
                log.warning("%s: the database is unavailable (%s); restarting the loop in %.1f s",
                            name, _summary(error), delay)
            else:
                crashes += 1
                metrics.loop_failures.labels(loop=name).inc()
                log.error("%s: the loop failed (%d in a row); restarting it in %.1f s", name, crashes, delay,
                          exc_info=error)
                if crashes >= limit and not stop.is_set():
                    raise LoopGaveUp(name, crashes, error) from error
        if stop.is_set() or await _stopped_within(stop, delay):
            return


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` or until ``stop`` is set; whether it was."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()


def _summary(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_summary(inner) for inner in error.exceptions)
    return str(error)
