"""fastlane under test: daemon nodes on one database, and worker processes connected to all (a no-op
handler, or a handler that takes a fixed time: :class:`BusyWorkers`).

:class:`FastlaneCluster` is used as an async context manager: leaving it (normally, on an
error, on Ctrl-C) notes every process's peak RSS and stops them all.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from fastlane.bench.harness import SHARDS, Bench, Deadline, now_utc
from fastlane.bench.processes import FASTLANE_ROOT, Daemon, WorkerProcess, child_environment
from fastlane.bench.profile import Profiler, profile_file
from fastlane.bench.secure import Secured
from fastlane.bench.usage import (
    CpuMeter,
    Metered,
    ProcessMemory,
    cpu_seconds,
    harness_metered,
    peak_rss,
    postmaster_pid,
    realtime_threads,
)

from fastlane.client import Client
from fastlane.testing.processes import summed

WORKER_TARGET = "fastlane.bench.lag_worker:worker"
WORKER_CONCURRENCY = 1000
START_TIMEOUT = 120.0
BUSY_WORKER_TARGET = "fastlane.bench.busy_worker:worker"
BUSY_JOB_TYPE = "bench.busy"  # the job type busy_worker's handler serves
HANDLER_MS_VARIABLE = "FASTLANE_BENCH_HANDLER_MS"  # how long busy_worker's handler takes
HANDLER_JITTER_VARIABLE = "FASTLANE_BENCH_HANDLER_JITTER"  # and by how much each run's time varies


@dataclass(frozen=True, slots=True, kw_only=True)
class BusyWorkers:
    """Workers whose handler takes a set time, a few runs at once: a capacity small and known in
    advance, so that a scenario can offer a chosen multiple of it and the node has to choose which
    runs wait (the no-op worker takes whatever comes at once: nothing ever waits for it)."""

    handler_ms: int
    concurrency: int  # attempts in flight at once on each worker process's stream to a node
    processes: int
    jitter: float = 0.0  # each run's handler time is drawn from handler_ms x [1 - jitter, 1 + jitter]

    @property
    def slots(self) -> int:
        """Attempts in flight at once on one node's streams."""
        return self.concurrency * self.processes

    def capacity_runs_per_s(self, nodes: int = 1) -> float:
        """Runs a second the workers can take: each slot finishes 1000 / handler_ms a second. A
        nominal figure: a slot's way back to the node (its result and credit) adds to each run."""
        return nodes * self.slots * 1000 / self.handler_ms

    def environment(self) -> dict[str, str]:
        """What busy_worker reads its handler time from."""
        return {HANDLER_MS_VARIABLE: str(self.handler_ms), HANDLER_JITTER_VARIABLE: f"{self.jitter:g}"}

    def as_json(self, nodes: int = 1) -> dict[str, object]:
        return {"worker_processes": self.processes, "worker_concurrency": self.concurrency,
                "handler_ms": self.handler_ms, "handler_jitter": self.jitter,
                "capacity_runs_per_s": self.capacity_runs_per_s(nodes)}


async def serve_accepts(flag: str) -> bool:
    """Whether ``fastlane serve``, as the nodes will be started, lists ``flag`` in its help: a
    scenario can then use a flag newer than some builds it may run against, and say when it could not."""
    completed = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "fastlane", "serve", "--help"], cwd=FASTLANE_ROOT, env=child_environment(),
        capture_output=True, timeout=60, check=False)
    return flag in completed.stdout.decode(errors="replace").split()


class FastlaneCluster:
    """``nodes`` daemons sharing ``db_url`` and ``workers`` worker processes connected to every node."""

    def __init__(self, bench: Bench, db_url: str, *, nodes: int = 1, workers: int = 1,
                 lease_ttl: timedelta | None = None, label: str = "fastlane", secured: Secured | None = None,
                 busy: BusyWorkers | None = None, node_args: Sequence[str] = ()) -> None:
        """``secured``: run the nodes with TLS and tokens, and connect to them so (``--secure``).
        ``busy``: the workers run busy_worker's slow handler instead of the no-op one (``workers``
        is then ``busy.processes``). ``node_args``: more ``fastlane serve`` flags for every node."""
        self._bench = bench
        self._label = label
        extra = ["--shard-lease-ttl", f"{lease_ttl.total_seconds():g}"] if lease_ttl else []
        extra += secured.node_args() if secured else []
        extra += node_args
        self._client_options = secured.client_options() if secured else {}
        workdir = bench.workdir
        self.daemons = [
            Daemon(db_url, workdir / f"{label}-node-{index}.log", node_id=f"node-{index}", shards=SHARDS,
                   extra_args=extra, client_options=self._client_options)
            for index in range(1, nodes + 1)
        ]
        addresses = [daemon.address for daemon in self.daemons]
        if busy is not None:
            workers = busy.processes
        target = BUSY_WORKER_TARGET if busy else WORKER_TARGET
        concurrency = busy.concurrency if busy else WORKER_CONCURRENCY
        handler = busy.environment() if busy else {}
        self.record_paths: list[Path] = [workdir / f"{label}-received-{index}.txt" for index in range(1, workers + 1)]
        worker_args = [*(secured.worker_args() if secured else ()), *bench.worker_scheduling_args()]
        self.workers = [
            WorkerProcess(target, addresses, workdir / f"{label}-worker-{index}.log",
                          concurrency=concurrency, env=child_environment(FASTLANE_BENCH_RECORD=str(path), **handler),
                          extra_args=worker_args)
            for index, path in enumerate(self.record_paths, start=1)
        ]
        self.started_at: datetime | None = None
        self.ready_at: datetime | None = None
        self._stopped = False
        self._profilers: list[Profiler] = []

    async def __aenter__(self) -> FastlaneCluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    async def start(self, *, with_workers: bool = True) -> datetime:
        """Start every node and worker; return when shards are balanced and workers connected."""
        progress = self._bench.progress
        progress.phase(f"starting {len(self.daemons)} node(s)")
        self.started_at = now_utc()
        for daemon in self.daemons:
            daemon.start()
        deadline = Deadline(START_TIMEOUT)
        for daemon in self.daemons:
            await daemon.wait_ready(timeout=max(deadline.remaining, 1.0))
        if len(self.daemons) > 1:
            await self._wait_balanced(deadline)
        if with_workers and self.workers:
            progress.phase(f"starting {len(self.workers)} worker(s)")
            for worker in self.workers:
                worker.start()
            await self._wait_workers(deadline)
        self.ready_at = now_utc()
        progress.end()
        return self.ready_at

    async def _wait_balanced(self, deadline: Deadline) -> None:
        """Until every shard is owned and the owners are the nodes, each with its fair share."""
        node_ids = {f"node-{index}" for index in range(1, len(self.daemons) + 1)}
        async with Client(self.daemons[0].address, **self._client_options) as client:
            while True:
                status = await client.cluster()
                owners: dict[str, int] = {}
                for shard in status.shards:
                    owners[shard.owner] = owners.get(shard.owner, 0) + 1
                counts = [owners.get(node, 0) for node in node_ids]
                if set(owners) == node_ids and max(counts) - min(counts) <= 1:
                    return
                self._bench.progress.update(len([o for o in owners if o in node_ids]), len(node_ids),
                                            "nodes owning their share")
                if deadline.expired:
                    raise RuntimeError(f"shards not balanced over {len(node_ids)} nodes in time: {owners}")
                await asyncio.sleep(0.2)

    async def _wait_workers(self, deadline: Deadline) -> None:
        wanted = len(self.workers)
        while True:
            connected = [await asyncio.to_thread(self.metric, "fastlane_workers_connected", daemon)
                         for daemon in self.daemons if daemon.popen and daemon.popen.poll() is None]
            if connected and min(connected) >= wanted:
                return
            for worker in self.workers:
                if worker.popen and worker.popen.poll() is not None:
                    raise RuntimeError(f"a worker exited with {worker.popen.returncode}\n{worker.log_tail()}")
            if deadline.expired:
                raise RuntimeError(f"workers did not connect to every node in time\n{self.workers[0].log_tail()}")
            await asyncio.sleep(0.1)

    @staticmethod
    def metric(name: str, daemon: Daemon) -> float:
        """One sample of a node's metrics, as ``family{label="value",...}``: the sum of the
        family's samples with those labels, whatever their others (0 when absent)."""
        family, _, labels = name.partition("{")
        wanted = dict(pair.split("=", 1) for pair in labels.rstrip("}").split(",") if pair)
        return summed(daemon.metrics(), family, **{key: value.strip('"') for key, value in wanted.items()})

    async def scrape_first(self) -> dict[str, float]:
        """Every sample of the first node's metrics (empty if it is not running)."""
        daemon = self.daemons[0]
        if daemon.popen is None or daemon.popen.poll() is not None:
            return {}
        return await asyncio.to_thread(daemon.metrics)

    async def metric_total(self, name: str) -> float:
        """A sample summed over the nodes still running."""
        total = 0.0
        for daemon in self.daemons:
            if daemon.popen and daemon.popen.poll() is None:
                total += await asyncio.to_thread(self.metric, name, daemon)
        return total

    def cpu_meter(self) -> CpuMeter:
        """A meter of the CPU of every node and worker, of the PostgreSQL server with all its
        processes (on PostgreSQL) and of the harness: start it and stop it around what is measured."""
        processes = [Metered(f"node-{index}", "node", daemon.pid) for index, daemon in enumerate(self.daemons, start=1)]
        processes += [Metered(f"worker-{index}", "worker", worker.pid)
                      for index, worker in enumerate(self.workers, start=1)]
        if self._bench.pg is not None:
            processes.append(Metered("postgres", "postgres", postmaster_pid(self._bench.pg.data_dir), tree=True))
        processes.append(harness_metered())
        return CpuMeter(processes)

    def profiler(self) -> Profiler:
        """py-spy on the first node, writing to the scratch directory (``--out DIR/logs`` keeps it);
        one still attached when the cluster stops is killed first."""
        profiler = Profiler("node-1", self.daemons[0].pid, profile_file(self._bench.workdir, f"{self._label}-node-1"))
        self._profilers.append(profiler)
        return profiler

    def kill(self, index: int) -> datetime:
        """SIGKILL node ``index`` (0-based); returns the instant."""
        daemon = self.daemons[index]
        self._note_memory(f"{self._label} node-{index + 1} (killed)", daemon.pid)
        killed_at = now_utc()
        daemon.kill()
        return killed_at

    def stop(self) -> None:
        """Note peak RSS, then stop workers and nodes. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        for profiler in self._profilers:
            profiler.abandon()
        for index, daemon in enumerate(self.daemons, start=1):
            if daemon.popen and daemon.popen.poll() is None:
                self._note_memory(f"{self._label} node-{index}", daemon.pid)
        for index, worker in enumerate(self.workers, start=1):
            if worker.popen and worker.popen.poll() is None:
                self._note_memory(f"{self._label} worker-{index}", worker.pid)
        for process in (*self.workers, *self.daemons):
            process.stop()

    def _note_memory(self, name: str, pid: int | None) -> None:
        self._bench.memory.append(ProcessMemory(name, pid, peak_rss(pid), cpu_seconds(pid), realtime_threads(pid)))
