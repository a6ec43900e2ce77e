"""What the processes of a benchmark took: peak RSS and CPU time, read from ``/proc``."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """What a process took: its peak RSS, and the CPU time it used (user + system, all threads)
    over its life: with two cores shared by every process of a run, CPU is what the others miss."""

    name: str
    pid: int | None
    peak_rss_bytes: int | None
    cpu_s: float | None = None
    realtime_threads: int | None = None  # threads under real-time scheduling when it was noted

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "peak_rss_bytes": self.peak_rss_bytes, "cpu_s": self.cpu_s,
                "realtime_threads": self.realtime_threads}


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM and friends of a live process, in bytes; empty if it is gone."""
    figures: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                parts = value.split()
                if name.startswith("Vm") and len(parts) == 2 and parts[1] == "kB":
                    figures[name] = int(parts[0]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return figures


def peak_rss(pid: int | None) -> int | None:
    return proc_status(pid).get("VmHWM") if pid else None


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a live process so far (``/proc/PID/stat``), None if it is gone."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return round((utime + stime) / os.sysconf("SC_CLK_TCK"), 2)


def realtime_threads(pid: int | None) -> int | None:
    """How many threads of a live process run under SCHED_FIFO or SCHED_RR; None if it is gone
    (or not on Linux)."""
    if not pid or not hasattr(os, "sched_getscheduler"):
        return None
    count = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            policy = os.sched_getscheduler(int(task)) & ~os.SCHED_RESET_ON_FORK
        except OSError:  # the thread ended meanwhile
            continue
        count += policy in (os.SCHED_FIFO, os.SCHED_RR)
    return count


def current_rss(pid: int | None) -> int | None:
    return proc_status(pid).get("VmRSS") if pid else None


def harness_memory() -> ProcessMemory:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return ProcessMemory("harness", os.getpid(), usage.ru_maxrss * 1024, round(usage.ru_utime + usage.ru_stime, 2))
