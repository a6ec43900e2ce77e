"""The start alarms: a Linux timerfd the loop polls, and the loop-timer fallback.

Real clocks on a noisy machine: "never early" is strict, how late is bounded generously.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from fastlane.runtime.alarm import KernelAlarm, LoopAlarm, open_alarm

MS = 1_000_000
LATE_BOUND_NS = 50 * MS

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")


class Rings:
    """Counts rings and remembers when they came."""

    def __init__(self) -> None:
        self.at: list[int] = []
        self.rang = asyncio.Event()

    def __call__(self) -> None:
        self.at.append(time.time_ns())
        self.rang.set()


@pytest.mark.parametrize("precise", [True, False])
async def test_an_alarm_rings_once_on_its_instant_never_before(precise: bool) -> None:
    rings = Rings()
    alarm = open_alarm(asyncio.get_running_loop(), rings, precise=precise)
    assert isinstance(alarm, KernelAlarm if precise and sys.platform.startswith("linux") else LoopAlarm)
    for lead_ms in (20, 2, 0.2):
        rings.rang.clear()
        instant = time.time_ns() + int(lead_ms * MS)
        alarm.set(instant)
        await asyncio.wait_for(rings.rang.wait(), 5)
        assert instant <= rings.at[-1] < instant + LATE_BOUND_NS
    await asyncio.sleep(0.03)
    assert len(rings.at) == 3  # one-shot: nothing rings again unless set
    alarm.close()


@pytest.mark.parametrize("precise", [True, False])
async def test_setting_again_replaces_the_instant_and_clear_stops_it(precise: bool) -> None:
    rings = Rings()
    alarm = open_alarm(asyncio.get_running_loop(), rings, precise=precise)
    alarm.set(time.time_ns() + 10 * MS)
    later = time.time_ns() + 60 * MS
    alarm.set(later)  # replaces: no ring at the first instant
    await asyncio.wait_for(rings.rang.wait(), 5)
    assert rings.at == [rings.at[0]] and rings.at[0] >= later
    alarm.set(time.time_ns() + 10 * MS)
    alarm.clear()
    await asyncio.sleep(0.05)
    assert len(rings.at) == 1
    alarm.close()


@linux_only
async def test_an_instant_already_passed_rings_at_once_and_a_closed_alarm_never() -> None:
    rings = Rings()
    alarm = open_alarm(asyncio.get_running_loop(), rings)
    alarm.set(time.time_ns() - 5 * MS)
    await asyncio.wait_for(rings.rang.wait(), 5)
    alarm.set(time.time_ns() + 10 * MS)
    alarm.close()
    alarm.set(time.time_ns())  # after close: ignored, not an error
    await asyncio.sleep(0.05)
    assert len(rings.at) == 1


async def test_an_injected_clock_gets_the_loop_alarm() -> None:
    now = time.time_ns()
    alarm = open_alarm(asyncio.get_running_loop(), Rings(), now_ns=lambda: now)
    assert isinstance(alarm, LoopAlarm)
    alarm.close()
