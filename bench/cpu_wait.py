"""How long a thread waited for a CPU: the run-queue wait Linux counts for each thread.

The benchmark's workers (no-op and busy) record, with each run, how long their event-loop thread
was runnable but not running since the run before it started (the second field of
``/proc/thread-self/schedstat``, in nanoseconds), as ``cpu_wait_us=N``. A run that started late
while the thread had waited about that long is counted as waiting for a CPU: other processes held
the cores (on a small machine the node, PostgreSQL and the harness share them with the worker).
There a late start is typically the loop thread waiting behind a PostgreSQL backend's time slice:
this counter says how long the thread waited, and ``perf sched`` shows the same from outside.

The wait is counted since the run before started, not from this run's instant: where runs are
sparse (``fairness``'s quiet tenant alone) part of it may be long past; where several start in one
wake-up the first takes the whole wait. Reading the counter is cheap (one ``pread`` of an open
descriptor); where it cannot be read (not Linux) nothing is recorded.
"""

from __future__ import annotations

from fastlane.runtime.run_queue import RunQueueWait


class CpuWait:
    """The run-queue wait of the thread that creates it, read as increments from one run's start
    to the next (the first start has none: before it lie the worker's connecting and waiting)."""

    def __init__(self) -> None:
        self._waits = RunQueueWait()
        self._last: int | None = None

    def _total_ns(self) -> int | None:
        return self._waits.total_ns()

    def since_last_us(self) -> int | None:
        """Microseconds the thread waited for a CPU since the last call; None on the first call,
        and where the kernel does not say."""
        total = self._total_ns()
        last, self._last = self._last, total
        if total is None or last is None:
            return None
        return (total - last) // 1000


def record_field(waited_us: int | None) -> str:
    """The record's field for a wait, with its leading space; nothing when it is not known."""
    return "" if waited_us is None else f" cpu_wait_us={waited_us}"
