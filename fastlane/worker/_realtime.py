"""Real-time scheduling for the worker's event-loop thread, when asked for
(``Worker(realtime_priority=N)``, ``fastlane worker --realtime-priority N``).

Why: when every core is busy (a database, a node, other workers on the same machine), a woken
normal thread waits for a core. On a small machine shared with PostgreSQL, the loop thread can
wake on a held run's instant and wait behind a database backend's stretch of work before it runs,
with a short CPU slice (``_slice``) or without: the scheduler treats both as normal threads
sharing the core fairly. A ``SCHED_FIFO`` thread takes the CPU from
every normal thread the moment it wakes, so a held run starts on its instant (once the GIL is
free: a normal thread holding it still has to let go).

The risk is a real-time thread that keeps running: it keeps its core from every normal thread
(the kernel's real-time throttling, 95 % of each second by default, is the last bound). So:

- only the calling thread is raised, with ``SCHED_RESET_ON_FORK``: the threads and processes it
  starts (gRPC's, a handler's executor) are normal;
- a runaway guard: ``RLIMIT_RTTIME`` makes the kernel send ``SIGXCPU`` once a real-time thread has
  run for ``RUNAWAY_LIMIT`` without blocking (a handler computing on the loop, a loop saturated
  with work), and the guard's handler lowers the thread to normal scheduling until the worker
  stops, and says so. Python runs signal handlers on the main thread, between bytecodes, so a
  worker whose loop runs elsewhere is not raised (it says why), and a loop stuck inside C code is
  lowered only once it is back in Python (the hard limit, a SIGKILL, must be far off: see
  ``MIN_HARD_LIMIT_RATIO``). A loop that blocks now and then, however briefly, is never lowered.

Privilege: ``CAP_SYS_NICE``, or an ``RLIMIT_RTPRIO`` of at least the priority (``ulimit -r``).
Without it, or off Linux, the worker says why and runs with normal scheduling.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any

log = logging.getLogger("fastlane.worker")

MIN_PRIORITY, MAX_PRIORITY = 1, 99  # SCHED_FIFO's range on Linux
# Far longer than any step of a healthy loop (starting a batch of runs takes under a millisecond),
# short enough that a runaway gives its core back within a quarter of a second.
RUNAWAY_LIMIT = timedelta(milliseconds=250)
# RLIMIT_RTTIME's hard limit kills the process. The guard needs the main thread back in Python
# before it, so it is used only when the hard limit is unlimited or this many times its own.
MIN_HARD_LIMIT_RATIO = 4

_holder: RealtimeGrant | None = None  # one thread of a process at a time holds the guard


@dataclass(eq=False)
class RealtimeGrant:
    """The calling thread runs under ``SCHED_FIFO``; :meth:`release` puts everything back."""

    thread: int  # native id
    limit: timedelta
    on_lowered: Callable[[], None] | None
    _old_handler: Any = field(repr=False)
    _old_limits: tuple[int, int] = field(repr=False)
    lowered: bool = False

    def release(self) -> None:
        """Back to normal scheduling (if not lowered already), the old SIGXCPU handler and limit."""
        global _holder
        if not self.lowered:
            _lower(self.thread)
        signal.signal(signal.SIGXCPU, self._old_handler)
        resource.setrlimit(resource.RLIMIT_RTTIME, self._old_limits)
        if _holder is self:
            _holder = None

    def _runaway(self, signum: int, frame: FrameType | None) -> None:
        # On the main thread, which is the loop's: lower exactly that thread, once.
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # the kernel repeats it every second
        millis = self.limit / timedelta(milliseconds=1)
        try:
            _lower(self.thread)
        except OSError as error:
            log.error("the worker's event loop ran %g ms without blocking, and lowering it from real-time "
                      "priority failed: %s", millis, error)
            return
        self.lowered = True
        log.error("the worker's event loop ran %g ms without blocking (a handler computing on the loop, or "
                  "more work than it can take): it runs with normal scheduling until the worker stops", millis)
        if self.on_lowered is not None:
            self.on_lowered()


def request_realtime(priority: int, *, runaway_limit: timedelta = RUNAWAY_LIMIT,
                     on_lowered: Callable[[], None] | None = None) -> RealtimeGrant | None:
    """Run the calling thread under ``SCHED_FIFO`` at ``priority``, guarded; None if not (the log
    says why).

    Args:
        priority: 1 (lowest) to 99.
        runaway_limit: How long the thread may run without blocking before the guard lowers it.
        on_lowered: Called (on this thread, from the signal handler) once the guard has lowered it.

    Raises:
        ValueError: ``priority`` is not an integer from 1 to 99.
    """
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"real-time priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, "
                         f"got {priority!r}")
    refusal = _why_not(runaway_limit)
    if refusal is not None:
        log.warning("real-time priority not applied: %s; running with normal scheduling", refusal)
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except PermissionError:
        log.warning("real-time priority not applied: it needs CAP_SYS_NICE or an RLIMIT_RTPRIO of %d or more "
                    "(ulimit -r); running with normal scheduling", priority)
        return None
    except OSError as error:
        log.warning("real-time priority not applied: %s; running with normal scheduling", error)
        return None
    global _holder
    grant = _holder = RealtimeGrant(thread=threading.get_native_id(), limit=runaway_limit, on_lowered=on_lowered,
                                    _old_handler=signal.getsignal(signal.SIGXCPU),
                                    _old_limits=resource.getrlimit(resource.RLIMIT_RTTIME))
    signal.signal(signal.SIGXCPU, grant._runaway)
    resource.setrlimit(resource.RLIMIT_RTTIME, (runaway_limit // timedelta(microseconds=1), grant._old_limits[1]))
    return grant


def _why_not(limit: timedelta) -> str | None:
    """Why the guard could not be set up here, or None."""
    if not sys.platform.startswith("linux"):
        return "it needs Linux"
    if _holder is not None:
        return "another worker of this process holds it"
    if threading.current_thread() is not threading.main_thread():
        return "its runaway guard needs the event loop on the main thread"
    # None: a handler set outside Python; either that or a Python one is the application's own.
    if signal.getsignal(signal.SIGXCPU) not in (signal.SIG_DFL, signal.SIG_IGN):
        return "SIGXCPU, which its runaway guard needs, has a handler already"
    _, hard = resource.getrlimit(resource.RLIMIT_RTTIME)
    if hard != resource.RLIM_INFINITY and hard < MIN_HARD_LIMIT_RATIO * (limit // timedelta(microseconds=1)):
        return f"the hard RLIMIT_RTTIME ({hard} µs) would kill the worker before its runaway guard could act"
    return None


def _lower(thread: int) -> None:
    # Keeping the reset-on-fork flag: without CAP_SYS_NICE the kernel refuses to clear it.
    os.sched_setscheduler(thread, os.SCHED_OTHER | os.SCHED_RESET_ON_FORK, os.sched_param(0))
