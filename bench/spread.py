"""Trigger lag of one-shot jobs spread evenly over a time span, on one node.

    python -m bench.spread --backend sqlite --jobs 300 --over 10

Starts what it needs (a throwaway PostgreSQL for ``--backend postgres``, a daemon, a worker with
a no-op handler), creates ``--jobs`` jobs due at evenly spread instants starting a few seconds
ahead, waits until the worker has received them all, and reports the lag percentiles:

- release lag: when the node's timer released the run − its scheduled time;
- delivery lag: when the worker received it − its scheduled time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson

from bench.pgcluster import ThrowawayPostgres
from bench.processes import Daemon, WorkerProcess, child_environment
from fastlane.client import Client
from fastlane.models import Schedule

LEAD_IN = timedelta(seconds=3)  # time to create every job before the first is due


def percentiles(values_ms: list[float]) -> dict[str, float]:
    ordered = sorted(values_ms)
    if not ordered:
        return {}

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 3)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "p999": at(0.999), "max": round(ordered[-1], 3)}


async def measure(db_url: str, workdir: Path, jobs: int, over: float) -> dict:
    record = workdir / "received.txt"
    daemon = Daemon(db_url, workdir / "daemon.log", shards=64)
    worker = WorkerProcess("bench.lag_worker:worker", [], workdir / "worker.log",
                           env=child_environment(FASTLANE_BENCH_RECORD=str(record)))
    worker.argv += ["--server", daemon.address]
    daemon.start()
    try:
        await daemon.wait_ready()
        worker.start()
        async with Client(daemon.address) as client:
            deadline = time.monotonic() + 30
            while not any(node.workers_connected for node in (await client.cluster()).nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not connect\n{worker.log_tail()}")
                await asyncio.sleep(0.05)
            first = datetime.now(UTC) + LEAD_IN
            step = timedelta(seconds=over / jobs)
            for index in range(jobs):
                await client.create(f"spread-{index}", "bench.noop", Schedule.at_instant(first + index * step))
        last_due = first + (jobs - 1) * step
        deadline = time.monotonic() + (last_due - datetime.now(UTC)).total_seconds() + 30
        shown = -1
        while (done := _count_lines(record)) < jobs and time.monotonic() < deadline:
            if done != shown:
                _progress(done, jobs)
                shown = done
            await asyncio.sleep(0.2)
        _progress(_count_lines(record), jobs)
        print(file=sys.stderr)
    finally:
        worker.stop()
        daemon.stop()
    rows = [line.split() for line in record.read_text().splitlines() if line.strip()]
    runs = Counter(row[0] for row in rows)
    release = [(int(row[2]) - int(row[1])) / 1000 for row in rows if int(row[2])]
    delivery = [(int(row[3]) - int(row[1])) / 1000 for row in rows]
    return {
        "system": "fastlane",
        "scenario": "spread",
        "jobs": jobs,
        "over_s": over,
        "delivered": len(runs),
        "duplicates": sum(count - 1 for count in runs.values()),
        "release_lag_ms": percentiles(release),
        "delivery_lag_ms": percentiles(delivery),
    }


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _progress(done: int, total: int) -> None:
    width = 40
    filled = width * done // max(total, 1)
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs received", end="", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite", help="database (default sqlite)")
    parser.add_argument("--jobs", type=int, default=300, help="one-shot jobs to create (default 300)")
    parser.add_argument("--over", type=float, default=10.0, help="seconds the due times spread over (default 10)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastlane-bench-") as scratch:
        workdir = Path(scratch)
        if args.backend == "sqlite":
            result = asyncio.run(measure(f"sqlite:///{workdir / 'bench.db'}", workdir, args.jobs, args.over))
        else:
            with ThrowawayPostgres() as cluster:
                result = asyncio.run(measure(cluster.dsn, workdir, args.jobs, args.over))
    result["backend"] = args.backend
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0 if result["delivered"] == args.jobs and result["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
