"""One-shot alarms at instants of a clock that wake an event loop on time.

A worker's held run must start on its instant, not a millisecond later, and a node releases runs
on theirs. The event loop's own timers cannot do that: uvloop's (libuv's) count whole
milliseconds, and a wait of less than half of one is not a timer at all but a callback run at
once, so a loop waiting for an instant that close spins until it comes. A thread that sleeps
precisely and then calls into the loop can, but it must take the GIL back after its sleep, and
while the loop thread runs Python that wait can be longer than the sleep's own error; the thread
must also be scheduled onto a core before it can wake the loop. A Linux ``timerfd`` needs neither: the kernel makes the descriptor readable on the
instant, to the nanosecond, and the loop's own poll wakes on it, so nothing waits for the GIL and
there is no extra thread to schedule. Python exposes ``timerfd`` from 3.13 only, so it is called
through ``ctypes``; where that is not possible (another OS, a libc without it), the loop's timer
does the job, a millisecond or so less precise.

Both kinds are armed for one instant at a time (setting again replaces) and call ``ring`` on the
loop when it has come; neither rings early. An instant is given on the caller's clock (the node's
corrected clock, a worker's wall clock) and turned into a deadline of the monotonic clock when the
alarm is set: a step of the wall clock afterwards (a clock set by hand, a VM resumed) moves no
deadline, so it can make nothing ring early.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("fastlane.alarm")

_CLOCK_MONOTONIC = 1  # deadlines are of time.monotonic_ns(), which no step of the wall clock moves
_TFD_CLOEXEC = 0o2000000
_TFD_NONBLOCK = 0o4000
_TFD_TIMER_ABSTIME = 1
MIN_LOOP_WAIT = 0.001  # seconds: uvloop runs a wait under half a millisecond at once (see LoopAlarm)


class Alarm(Protocol):
    def set(self, instant_ns: int) -> None:
        """Ring at ``instant_ns`` (of the alarm's clock), replacing any instant set before."""

    def clear(self) -> None:
        """Do not ring until set again."""

    def close(self) -> None:
        """Release what the alarm holds; it never rings again."""


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class KernelAlarm:
    """An alarm on a Linux ``timerfd`` that the loop watches as a reader."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ring: Callable[[], None], libc: ctypes.CDLL,
                 now_ns: Callable[[], int] = time.time_ns) -> None:
        self._loop = loop
        self._ring = ring
        self._now_ns = now_ns
        self._settime = libc.timerfd_settime
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._fd: int | None = fd
        loop.add_reader(fd, self._readable)

    def set(self, instant_ns: int) -> None:
        deadline = time.monotonic_ns() + (instant_ns - self._now_ns())
        self._arm(max(deadline, 1))  # an all-zero value would disarm it

    def clear(self) -> None:
        self._arm(0)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)

    def _arm(self, instant_ns: int) -> None:
        if self._fd is None:
            return
        value = _Timespec(instant_ns // 1_000_000_000, instant_ns % 1_000_000_000)
        spec = _Itimerspec(_Timespec(0, 0), value)
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _readable(self) -> None:
        if self._fd is None:
            return
        try:
            os.read(self._fd, 8)  # the expiry count; reading it makes the descriptor wait again
        except BlockingIOError:  # set again after it became readable: not due any more
            return
        self._ring()


class LoopAlarm:
    """An alarm on the loop's own timer: about a millisecond of granularity, never early.

    A wait is at least a millisecond: the loop's timer would run a shorter one at once, and the
    alarm, not due yet, would set itself again and again until the instant came."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ring: Callable[[], None], now_ns: Callable[[], int]) -> None:
        self._loop = loop
        self._ring = ring
        self._now_ns = now_ns
        self._handle: asyncio.TimerHandle | None = None
        self._instant = 0

    def set(self, instant_ns: int) -> None:
        self.clear()
        self._instant = instant_ns
        wait = (instant_ns - self._now_ns()) / 1e9
        self._handle = self._loop.call_later(max(wait, MIN_LOOP_WAIT) if wait > 0 else 0.0, self._fired)

    def clear(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        self.clear()

    def _fired(self) -> None:
        self._handle = None
        if self._now_ns() < self._instant:  # the loop's timer rounds: not yet, look again
            self.set(self._instant)
            return
        self._ring()


def _libc_with_timerfd() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc_with_timerfd()


def open_alarm(
    loop: asyncio.AbstractEventLoop, ring: Callable[[], None], *, now_ns: Callable[[], int] = time.time_ns,
    precise: bool = True, real_time: bool | None = None,
) -> Alarm:
    """The most precise alarm this platform offers (a ``timerfd`` on Linux), ringing ``ring`` on
    ``loop`` at instants of ``now_ns``'s clock. The kernel's alarm needs a clock that advances as
    real time does: the wall clock, or ``real_time=True`` for another that does (one corrected by
    an offset). Any other clock (a test's, moved by hand) or ``precise=False`` gets the loop's
    timer, which asks ``now_ns`` again when it fires."""
    if real_time is None:
        real_time = now_ns is time.time_ns
    if precise and real_time and _LIBC is not None:
        try:
            return KernelAlarm(loop, ring, _LIBC, now_ns)
        except (OSError, NotImplementedError) as exc:  # NotImplementedError: a loop without add_reader
            log.info("no timerfd alarm (%s): waking on the loop's timer, about 1 ms less precise", exc)
    return LoopAlarm(loop, ring, now_ns)
