"""How long a thread has waited for a CPU: the run-queue wait Linux counts for each thread.

The second field of ``/proc/thread-self/schedstat`` is the time, in nanoseconds, the thread was
runnable but not running: another process (on a small machine, PostgreSQL or a worker) had the
core. The node's stall probe reads it for its loop thread to tell a stall the loop itself caused
from one it only suffered; the benchmark's workers read it to say whether a late start waited for
a CPU. A reading is one ``pread`` of a descriptor kept open; where the kernel does not say (not
Linux), it is None.
"""

from __future__ import annotations

import os
import threading


class RunQueueWait:
    """The run-queue wait of the thread that creates it, in nanoseconds since the thread began."""

    def __init__(self) -> None:
        self._thread = threading.get_native_id()
        try:
            # thread-self names the calling thread when opened; the descriptor keeps naming it.
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def total_ns(self) -> int | None:
        """The wait so far; None where the kernel does not say, or when asked from another thread
        (whose wait would be misread as this one's)."""
        if self._fd is None or threading.get_native_id() != self._thread:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
