"""How the fast lane's loops wait: for a wake event, a deadline or the stop, whichever comes first."""

from __future__ import annotations

import asyncio
import contextlib


async def sleep_until_woken(wake: asyncio.Event, stopping: asyncio.Event, seconds: float) -> None:
    """Sleep until ``wake`` is set (it is cleared first) or ``seconds`` pass; not at all once stopping."""
    wake.clear()
    if seconds <= 0 or stopping.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()


async def pause(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` unless stopping (which is never cleared)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stopping.wait()
