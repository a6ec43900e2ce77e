"""How long a thread waited for a CPU: the run-queue wait Linux counts for each thread.

The benchmark's no-op worker records, with each run, how long its event-loop thread was runnable
but not running since the run before it started (the second field of
``/proc/thread-self/schedstat``, in nanoseconds). A run that started late while the thread had
waited about that long for a CPU was late because other processes held the cores (on a small
machine the node, PostgreSQL and the harness share them with the worker), not because of
anything on the worker's loop. Measured this way in ``fastlane bench spread --backend postgres``
(and with ``perf sched``), the late starts were the loop thread waiting 1-3.6 ms behind a
PostgreSQL backend's time slice.

Reading the counter costs about a microsecond (one ``pread`` of an open descriptor); where it
cannot be read (not Linux) nothing is recorded.
"""

from __future__ import annotations

import os


class CpuWait:
    """The run-queue wait of the thread that creates it, read as increments."""

    def __init__(self) -> None:
        try:
            # thread-self names the calling thread: the one whose loop runs the handlers.
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None
        self._last = self._total_ns()

    def _total_ns(self) -> int | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def since_last_us(self) -> int | None:
        """Microseconds the thread waited for a CPU since the last call (or since it was
        created); None where the kernel does not say."""
        total = self._total_ns()
        if total is None or self._last is None:
            self._last = total
            return None
        waited, self._last = total - self._last, total
        return waited // 1000
