"""Waiting for a condition in a test: :func:`until`.

A test that sleeps a fixed time is slow when the machine is fast and flaky when it is slow. It
should wait for what it means instead: poll a condition on short waits, and fail after a bound
that names what never happened. One implementation, so every test waits the same way.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
DEFAULT_INTERVAL = 0.02


class WaitTimedOut(TimeoutError, AssertionError):
    """A wait of :func:`until` ran out. A TimeoutError, as any bounded wait that ends so; and an
    AssertionError, because in a test it is a failed expectation: pytest reports it as one, and a
    test that adds what it saw to a failure (``except AssertionError``) catches it too."""


async def until(
    condition: Callable[[], T | Awaitable[T]],
    timeout: float = DEFAULT_TIMEOUT,
    what: str | None = None,
    interval: float = DEFAULT_INTERVAL,
) -> T:
    """Call ``condition`` (a plain or an async function) until it returns something truthy.

    Args:
        condition: Called with no arguments; its result is awaited if it is awaitable.
        timeout: Seconds to wait in all, from the call.
        what: What the test waits for, for the error ("the run to succeed").
        interval: Seconds between two calls. The first call is at once.

    Returns:
        The first truthy value ``condition`` returned, so a test can wait for a thing and keep it:
        ``run = await until(lambda: store.runs.get(run_id))``.

    Raises:
        WaitTimedOut: ``timeout`` passed first (a TimeoutError and an AssertionError); the message
            names ``what`` and the last value.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise WaitTimedOut(f"timed out after {timeout:g} s waiting for {what or 'the condition'} "
                               f"(last: {value!r})")
        await asyncio.sleep(min(interval, remaining))
