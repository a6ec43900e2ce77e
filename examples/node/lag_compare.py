"""Start lag of the Node example worker against the Python SDK's worker, on one SQLite node.

    .venv/bin/python examples/node/lag_compare.py [--jobs 1000] [--rate 200] [--lead 2]
                                                  [--send-ahead MS] [--workdir DIR] [--json]

For each worker in turn, never both at once: a fresh node (``fastlane serve``) on a new SQLite
database, the worker, and ``--jobs`` one-shot jobs created ``--rate`` a second through the Python
client, each due at an instant (to the microsecond) ``--lead`` seconds after its creation, so the
runs fall due at that rate too. Each handler records, as its first act, when it was entered; the
start lag of a run is that minus its scheduled instant. Printed: p50, p90, p99 and max of each,
and the runs entered before their instant by this host's wall clock ("early": the workers start
runs sent ahead by their estimate of the node's clock, right to within its uncertainty).

The workers: examples/node/worker.js with its ``node.lag`` handler, and the benchmark suite's
no-op worker (bench/lag_worker.py: ``fastlane bench`` measures the Python SDK's start lag with it),
both at 1,000 runs in flight, with their defaults otherwise. The node sends runs ahead as its
``--send-ahead`` says (default: the node's own default).

One default differs and shows in the tails: the Python SDK asks Linux (6.12 or later) for CPU
slices of 200 us for its event loop's thread (fastlane/worker/_slice.py), so that it wakes on a
held run's instant without waiting out a busy neighbour's slice; Node has no such call.
``--node-cpu-slice 200`` starts the Node worker with the same request made for it (the slice is
kept across exec), to compare the two like for like.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fastlane.client import Client
from fastlane.domain.models import Schedule
from fastlane.testing import until
from fastlane.testing.processes import ROOT, Daemon, Process, WorkerProcess, child_environment

EXAMPLE = ROOT / "examples" / "node"
CONCURRENCY = 1000  # as bench/cluster.py runs its workers
CONNECT_TIMEOUT_S = 30.0
COLLECT_GRACE_S = 30.0  # after the last due instant, for the last runs to be entered
JOB_TYPE = {"node": "node.lag", "python": "bench.noop"}
DEFAULT_SEND_AHEAD_MS = 20  # fastlane serve --send-ahead, when not given


@dataclass
class Outcome:
    worker: str
    lags_ms: list[float]  # entered - scheduled, one per run
    jobs: int
    created_late: int  # jobs whose creation returned after their instant less the node's lead

    def quantile(self, q: float) -> float:
        ordered = sorted(self.lags_ms)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    def figures(self) -> dict[str, object]:
        if not self.lags_ms:
            return {"worker": self.worker, "runs": 0, "jobs": self.jobs}
        return {
            "worker": self.worker, "runs": len(self.lags_ms), "jobs": self.jobs,
            **{name: round(self.quantile(q), 3) for name, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99))},
            "max_ms": round(max(self.lags_ms), 3), "min_ms": round(min(self.lags_ms), 3),
            "early": sum(1 for lag in self.lags_ms if lag < 0), "created_late": self.created_late,
        }


def node_lags(path: Path) -> dict[str, float]:
    """worker.js --lag-file: JSON lines, nanoseconds."""
    lags: dict[str, float] = {}
    for line in _lines(path):
        record = json.loads(line)
        lags.setdefault(record["run_id"], (int(record["entered_ns"]) - int(record["scheduled_ns"])) / 1e6)
    return lags


def python_lags(path: Path) -> dict[str, float]:
    """bench/lag_worker.py: "run_id scheduled_us released_us received_us job_id entered_us ...", microseconds."""
    lags: dict[str, float] = {}
    for line in _lines(path):
        run_id, scheduled_us, _released, _received, _job, entered_us, *_ = line.split()
        lags.setdefault(run_id, (int(entered_us) - int(scheduled_us)) / 1e3)
    return lags


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    # The last line may be half written while the worker runs: only complete lines count.
    text = path.read_text()
    return [line for line in text.splitlines(keepends=True) if line.endswith("\n") and line.strip()]


# Asks for the CPU slice, then becomes node: sched_setattr's slice survives the exec.
_SLICE_SHIM = """
import os, sys
from datetime import timedelta
from fastlane.worker._slice import request_cpu_slice
if not request_cpu_slice(timedelta(microseconds=int(sys.argv[1]))):
    print("lag_compare.py: the kernel refused the CPU slice; the Node worker runs without it", file=sys.stderr)
os.execv(sys.argv[2], sys.argv[2:])
"""


def start_worker(kind: str, address: str, workdir: Path, cpu_slice_us: int = 0) -> tuple[Process, Path]:
    record = workdir / f"{kind}-lag.txt"
    log = workdir / f"{kind}-worker.log"
    if kind == "node":
        node = shutil.which("node")
        if node is None or not (EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir():
            raise SystemExit("lag_compare.py needs node on PATH and examples/node/node_modules: run `make node-deps`")
        argv = [node, str(EXAMPLE / "worker.js"), "--server", address, "--concurrency", str(CONCURRENCY),
                "--lag-file", str(record)]
        if cpu_slice_us:
            argv = [sys.executable, "-c", _SLICE_SHIM, str(cpu_slice_us), *argv]
        worker: Process = Process(argv, log, child_environment())
    else:
        worker = WorkerProcess("fastlane.bench.lag_worker:worker", [address], log, concurrency=CONCURRENCY,
                               env=child_environment(FASTLANE_BENCH_RECORD=str(record)))
    worker.start()
    return worker, record


async def wait_connected(daemon: Daemon, client: Client, worker: Process) -> None:
    """Until the worker is connected and the node has its clock estimate (runs go out ahead)."""
    async def ready() -> bool:
        if worker.popen is not None and worker.popen.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.popen.returncode}:\n{worker.log_tail()}")
        status = await client.cluster()
        return (sum(node.workers_connected for node in status.nodes) == 1
                and daemon.metrics().get("fastlane_worker_clock_uncertainty_seconds_count", 0) > 0)

    await until(ready, CONNECT_TIMEOUT_S, "the worker to connect and report a clock estimate", interval=0.1)


async def create_jobs(client: Client, kind: str, jobs: int, rate: float, lead: float, ahead_s: float) -> tuple[float, int]:
    """``jobs`` one-shot jobs created ``rate`` a second, each due ``lead`` s after it is created;
    the last due instant (epoch seconds) and how many were created too late to be sent ahead."""
    start = time.time() + 0.2
    late = 0

    async def create(index: int, due: datetime) -> None:
        nonlocal late
        await client.create(f"lag-{kind}-{index}", JOB_TYPE[kind], Schedule.at_instant(due))
        if time.time() > due.timestamp() - ahead_s:
            late += 1

    tasks = []
    for index in range(jobs):
        created_at = start + index / rate
        await asyncio.sleep(max(0.0, created_at - time.time()))
        # Whole microseconds: what the node keeps of an instant.
        due = datetime.fromtimestamp(round((created_at + lead) * 1e6) / 1e6, UTC)
        tasks.append(asyncio.create_task(create(index, due)))
    await asyncio.gather(*tasks)
    return start + (jobs - 1) / rate + lead, late


async def measure(kind: str, args: argparse.Namespace, workdir: Path, progress: Callable[[str], None]) -> Outcome:
    extra = ["--send-ahead", str(args.send_ahead)] if args.send_ahead is not None else []
    daemon = Daemon(f"sqlite:///{workdir}/{kind}.db", workdir / f"{kind}-node.log", node_id=f"{kind}-node",
                    extra_args=extra)
    processes: list[Process] = [daemon]
    try:
        daemon.start()
        await daemon.wait_ready()
        worker, record = start_worker(kind, daemon.address, workdir, args.node_cpu_slice)
        processes.append(worker)
        read = node_lags if kind == "node" else python_lags
        async with Client(daemon.address) as client:
            await wait_connected(daemon, client, worker)
            progress(f"{kind}: creating {args.jobs:,} jobs at {args.rate:g}/s, each due {args.lead:g} s later")
            ahead_s = (args.send_ahead if args.send_ahead is not None else DEFAULT_SEND_AHEAD_MS) / 1000
            last_due, late = await create_jobs(client, kind, args.jobs, args.rate, args.lead, ahead_s)
        deadline = last_due + COLLECT_GRACE_S
        while len(lags := read(record)) < args.jobs and time.time() < deadline:
            await asyncio.sleep(0.2)
        return Outcome(f"{kind} ({'examples/node/worker.js' if kind == 'node' else 'Python SDK'})",
                       list(lags.values()), args.jobs, late)
    finally:
        for process in reversed(processes):
            process.stop()


def table(outcomes: list[Outcome]) -> str:
    columns = ("runs", "p50_ms", "p90_ms", "p99_ms", "max_ms", "min_ms", "early")
    rows = [f"{'worker':<46}" + "".join(f"{name:>10}" for name in columns)]
    for outcome in outcomes:
        figures = outcome.figures()
        rows.append(f"{outcome.worker:<46}" + "".join(f"{figures.get(name, '-')!s:>10}" for name in columns))
    return "\n".join(rows)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="jobs created (and due) per second")
    parser.add_argument("--lead", type=float, default=2.0, help="seconds from a job's creation to its instant")
    parser.add_argument("--send-ahead", type=int, default=None, help="the node's --send-ahead, ms (default: its own)")
    parser.add_argument("--node-cpu-slice", type=int, default=0, metavar="MICROSECONDS",
                        help="ask Linux for CPU slices this short for the Node worker, as the Python SDK does "
                             "for itself (100 to 100000; default: off, Node's own scheduling)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep databases, logs and records here")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="fastlane-lag-") as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        outcomes = [await measure(kind, args, workdir, progress) for kind in ("node", "python")]
    if args.node_cpu_slice:
        outcomes[0].worker += f", {args.node_cpu_slice} us slices"
    if args.json:
        print(json.dumps([outcome.figures() for outcome in outcomes], indent=2))
    else:
        ahead = f"--send-ahead {args.send_ahead}" if args.send_ahead is not None else "the default --send-ahead"
        print(f"start lag (handler entered - scheduled instant): {args.jobs:,} one-shot jobs due at {args.rate:g}/s, "
              f"one node on SQLite with {ahead}")
        print(table(outcomes))
        for outcome in outcomes:
            if outcome.created_late or len(outcome.lags_ms) < outcome.jobs:
                print(f"note: {outcome.worker}: {outcome.created_late} jobs created too late to be sent ahead, "
                      f"{outcome.jobs - len(outcome.lags_ms)} runs not entered before the deadline")
    return 0 if all(len(outcome.lags_ms) == outcome.jobs for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
