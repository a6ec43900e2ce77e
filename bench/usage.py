"""What the processes of a benchmark took: peak RSS and CPU time, read from ``/proc``; and the CPU
each process (the PostgreSQL server with all its children among them) spent over a measured
interval, per run (:class:`CpuMeter`)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


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


def open_files(pid: int | None) -> int | None:
    """How many file descriptors a live process holds (sockets and pipes too); None if it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd")) if pid else None
    except OSError:
        return None


def files_open_under(pid: int | None, prefix: str) -> int | None:
    """How many of a live process's descriptors name a path starting with ``prefix`` (an SQLite
    database, its journal and shared memory: one set per connection)."""
    if not pid:
        return None
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    prefix = os.path.realpath(prefix)  # the links name real paths: a temporary directory may be a symlink
    count = 0
    for name in names:
        try:
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith(prefix)
        except OSError:  # closed meanwhile
            continue
    return count


def thread_count(pid: int | None) -> int | None:
    """The threads of a live process; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def harness_memory() -> ProcessMemory:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return ProcessMemory("harness", os.getpid(), usage.ru_maxrss * 1024, round(usage.ru_utime + usage.ru_stime, 2))


# -- CPU over a measured interval ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatLine:
    """What ``/proc/PID/stat`` says of a process's CPU: its parent, and its user + system ticks,
    its own and those of its children it has reaped (``cutime`` + ``cstime``), so that a backend
    that exits during the interval still counts: its ticks move to its parent."""

    pid: int
    ppid: int
    ticks: int


def parse_stat(text: str) -> StatLine | None:
    """One ``/proc/PID/stat`` line; None if it does not parse. The command name (in parentheses)
    may hold spaces and parentheses itself: the fields are read after its last ``)``."""
    head, paren, rest = text.rpartition(")")
    if not paren:
        return None
    fields = rest.split()
    try:
        pid = int(head.split("(", 1)[0])
        # proc(5): ppid is field 4; utime, stime, cutime and cstime fields 14 to 17.
        return StatLine(pid, int(fields[1]), sum(int(value) for value in fields[11:15]))
    except (ValueError, IndexError):
        return None


def read_stats(proc: Path = Path("/proc")) -> dict[int, StatLine]:
    """Every process's stat line now (processes that end while they are read are left out)."""
    stats: dict[int, StatLine] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = parse_stat((entry / "stat").read_text())
        except OSError:
            continue
        if line is not None:
            stats[line.pid] = line
    return stats


def tree_ticks(root: int, stats: Mapping[int, StatLine]) -> int | None:
    """CPU ticks of ``root`` and all its descendants (for PostgreSQL: the postmaster, its
    backends, walwriter, checkpointer...); None if ``root`` is gone."""
    if root not in stats:
        return None
    children: dict[int, list[int]] = {}
    for line in stats.values():
        children.setdefault(line.ppid, []).append(line.pid)
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += stats[pid].ticks
        todo += children.get(pid, [])
    return total


def postmaster_pid(data_dir: str | Path) -> int | None:
    """The PostgreSQL server's pid, from the first line of ``postmaster.pid`` in its data directory."""
    try:
        first = (Path(data_dir) / "postmaster.pid").read_text().split("\n", 1)[0]
        return int(first)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Metered:
    """A process (or a process tree) whose CPU a :class:`CpuMeter` measures: its name in the report,
    its role (``node``, ``worker``, ``postgres``, ``harness``) and its pid; ``tree``: with every
    descendant."""

    name: str
    role: str
    pid: int | None
    tree: bool = False


# Roles counted in the total: the system under test (for the floor, the harness is its database
# driver: ``driver``). Otherwise the harness only creates jobs beforehand and polls while it is
# measured; it gets a line of its own.
MEASURED_ROLES = ("node", "worker", "postgres", "driver")


class CpuMeter:
    """CPU seconds of each process between :meth:`start` and :meth:`stop`, and per run.

    Read from ``/proc`` at both ends (user + system of every thread, and of reaped children): a
    process that starts or ends inside the interval is not counted (its line says null).
    """

    def __init__(self, processes: Iterable[Metered], *, proc: Path = Path("/proc")) -> None:
        self._processes = list(processes)
        self._proc = proc
        self._before: dict[str, int | None] = {}
        self._started = 0.0

    def _ticks(self) -> dict[str, int | None]:
        stats = read_stats(self._proc)
        ticks: dict[str, int | None] = {}
        for process in self._processes:
            if process.pid is None:
                ticks[process.name] = None
            elif process.tree:
                ticks[process.name] = tree_ticks(process.pid, stats)
            else:
                line = stats.get(process.pid)
                ticks[process.name] = None if line is None else line.ticks
        return ticks

    def start(self) -> None:
        self._before, self._started = self._ticks(), time.monotonic()

    def stop(self, runs: int) -> dict[str, object]:
        """The interval's figures: ``interval_s``, ``runs`` and one row per process, then one per
        role with more than one process, then ``total`` (of :data:`MEASURED_ROLES`)."""
        after, interval = self._ticks(), time.monotonic() - self._started
        seconds: dict[str, float | None] = {}
        for process in self._processes:
            before, now = self._before.get(process.name), after.get(process.name)
            seconds[process.name] = None if before is None or now is None else (now - before) / _TICKS
        return cpu_figures(self._processes, seconds, runs=runs, interval_s=interval)


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_figures(processes: Sequence[Metered], seconds: Mapping[str, float | None], *, runs: int,
                interval_s: float) -> dict[str, object]:
    """The rows of :meth:`CpuMeter.stop` from each process's CPU seconds."""

    def row(name: str, role: str, cpu: float | None) -> dict[str, object]:
        return {"name": name, "role": role, "cpu_s": None if cpu is None else round(cpu, 3),
                "us_per_run": None if cpu is None or runs <= 0 else round(cpu * 1e6 / runs, 1),
                "cores": None if cpu is None or interval_s <= 0 else round(cpu / interval_s, 3)}

    rows = [row(p.name, p.role, seconds.get(p.name)) for p in processes]
    for role in MEASURED_ROLES:
        members = [seconds.get(p.name) for p in processes if p.role == role]
        if len(members) > 1:
            rows.append(row(f"{role}s", f"{role} (all)", _sum(members)))
    rows.append(row("total", "total", _sum([seconds.get(p.name) for p in processes if p.role in MEASURED_ROLES])))
    return {"interval_s": round(interval_s, 2), "runs": runs, "processes": rows}


def _sum(values: Sequence[float | None]) -> float | None:
    """The sum, or None if any is unknown (a total that leaves a process out would mislead)."""
    return None if not values or any(value is None for value in values) else sum(v for v in values if v is not None)


def harness_metered() -> Metered:
    return Metered("harness", "harness", os.getpid())
