"""Real-time scheduling for the worker's event-loop thread, when asked for
(``Worker(realtime_priority=N)``, ``fastlane worker --realtime-priority N``).

Why: when every core is busy (a database, a node, other workers on the same machine), a woken
normal thread waits for a core. On a 2-core machine sharing it with PostgreSQL, the loop thread
waited 1-3.6 ms behind a database backend at the instants that started late, short CPU slice
(``_slice``) or not (bench/README.md, tenth sitting). A ``SCHED_FIFO`` thread takes the CPU from
every normal thread the moment it wakes, so a held run starts on its instant.

The risk is a real-time thread that does not sleep: it keeps its core from every normal thread
(the kernel's throttling still leaves them 5 %). Two bounds:

- only the calling thread is raised, with ``SCHED_RESET_ON_FORK``: the threads and processes it
  starts (gRPC's, a handler's executor) are normal;
- a runaway guard: ``RLIMIT_RTTIME`` makes the kernel send ``SIGXCPU`` once a real-time thread has
  run for ``RUNAWAY_LIMIT`` without blocking (a handler computing on the loop, a loop saturated
  with work), and the guard's handler lowers the thread to normal scheduling for good and says so.
  Python runs signal handlers on the main thread only, so a worker whose loop runs elsewhere is
  not raised (it says why).

Privilege: ``CAP_SYS_NICE``, or an ``RLIMIT_RTPRIO`` of at least the priority (``ulimit -r``);
in Kubernetes, ``securityContext.capabilities.add: ["SYS_NICE"]``. Without it, or off Linux, the
worker says why and runs with normal scheduling.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from types import FrameType

log = logging.getLogger("fastlane.worker")

MIN_PRIORITY, MAX_PRIORITY = 1, 99  # SCHED_FIFO's range on Linux
# Far longer than any step of a healthy loop (starting a batch of runs takes under a millisecond),
# short enough that a runaway gives its core back within a quarter of a second.
RUNAWAY_LIMIT = timedelta(milliseconds=250)


def request_realtime(priority: int, *, runaway_limit: timedelta = RUNAWAY_LIMIT,
                     on_lowered: Callable[[], None] | None = None) -> bool:
    """Run the calling thread under ``SCHED_FIFO`` at ``priority``, guarded; whether it now does.

    Args:
        priority: 1 (lowest) to 99.
        runaway_limit: How long the thread may run without blocking before the guard lowers it.
        on_lowered: Called (on this thread, from the signal handler) once the guard has lowered it.

    Raises:
        ValueError: ``priority`` is out of range.
    """
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"real-time priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority}")
    if not sys.platform.startswith("linux"):
        log.warning("real-time priority not applied: it needs Linux")
        return False
    if threading.current_thread() is not threading.main_thread():
        log.warning("real-time priority not applied: its runaway guard needs the event loop on the main thread")
        return False
    if signal.getsignal(signal.SIGXCPU) not in (signal.SIG_DFL, None):
        log.warning("real-time priority not applied: SIGXCPU, which its runaway guard needs, has a handler already")
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except PermissionError:
        log.warning("real-time priority not applied: it needs CAP_SYS_NICE or an RLIMIT_RTPRIO of %d or more "
                    "(ulimit -r); running with normal scheduling", priority)
        return False
    except OSError as error:
        log.warning("real-time priority not applied: %s", error)
        return False
    _guard(runaway_limit, on_lowered)
    return True


def _guard(limit: timedelta, on_lowered: Callable[[], None] | None) -> None:
    """Have the kernel signal a thread that runs ``limit`` without blocking, and lower it then."""
    loop_thread = threading.get_native_id()

    def lower(signum: int, frame: FrameType | None) -> None:
        # On the main thread, which is the loop's: lower exactly that thread, once.
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # the kernel repeats it every second
        try:
            os.sched_setscheduler(loop_thread, os.SCHED_OTHER, os.sched_param(0))
        except OSError as error:
            log.error("the worker's event loop ran %g ms without pausing, and lowering it from real-time "
                      "priority failed: %s", limit / timedelta(milliseconds=1), error)
            return
        log.error("the worker's event loop ran %g ms without pausing (a handler computing on the loop, or "
                  "more work than it can take): it now runs with normal scheduling until the worker restarts",
                  limit / timedelta(milliseconds=1))
        if on_lowered is not None:
            on_lowered()

    signal.signal(signal.SIGXCPU, lower)
    _, hard = resource.getrlimit(resource.RLIMIT_RTTIME)
    micros = limit // timedelta(microseconds=1)
    if hard != resource.RLIM_INFINITY:
        micros = min(micros, hard // 2)  # the hard limit is SIGKILL: keep the soft one well before it
    resource.setrlimit(resource.RLIMIT_RTTIME, (micros, hard))
