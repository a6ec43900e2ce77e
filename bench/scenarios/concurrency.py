"""``concurrency``: runs sharing a concurrency key never run more at once than its limit, across
the cluster, checked from the workers' own records.

1,000 one-shot jobs of one tenant share the key ``bench-ledger`` with a limit of 5 and all fall
due at the same instant, on three nodes (PostgreSQL; one node on SQLite, the embedded store) with
busy workers (a 20 ms handler, 10 at once per worker process, so the workers alone would take far
more than 5 at a time). Each worker writes when each handler started and ended; the figure is the
most handlers running at one instant (target: ≤ the limit; = the limit shows the cap was used,
not merely respected), and the rate the key's runs went at against the best the limit allows
(``limit x 1000 / handler_ms`` a second).
Scaled: ``1,000 x scale`` jobs (at least 50).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastlane.bench.cluster import BUSY_JOB_TYPE, BusyWorkers, FastlaneCluster
from fastlane.bench.harness import (
    CREATE_WORST_S,
    START_ALLOWANCE_S,
    Bench,
    Deadline,
    Offer,
    RecordTail,
    create_offers,
    note_overrun,
    system_result,
    wait_for_runs,
)

from fastlane.testing.measure import most_at_once

JOBS = 1_000
KEY, LIMIT = "bench-ledger", 5
HANDLER_MS = 20
CONCURRENCY = 10
NODES_ON_POSTGRES = 3
GRACE_S = 60.0


def nodes_for(bench: Bench) -> int:
    return max(bench.nodes, NODES_ON_POSTGRES) if bench.backend == "postgres" else 1


def best_runs_per_s() -> float:
    return LIMIT * 1000 / HANDLER_MS


def budget(bench: Bench) -> float:
    jobs = bench.scaled(JOBS, minimum=50)
    return START_ALLOWANCE_S * 2 + jobs * CREATE_WORST_S + 3 * jobs / best_runs_per_s() + GRACE_S


def handler_intervals(record_paths: list[Path]) -> dict[str, tuple[int, int]]:
    """Per run: its handler's start and end (µs), from the record files and their ``.ends``."""
    started: dict[str, int] = {}
    ended: dict[str, int] = {}
    for path in record_paths:
        for line in path.read_text().splitlines() if path.exists() else []:
            fields = line.split()
            if len(fields) >= 6:
                started.setdefault(fields[0], int(fields[5]))
        ends = Path(f"{path}.ends")
        for line in ends.read_text().splitlines() if ends.exists() else []:
            run_id, at = line.split()
            ended[run_id] = int(at)
    return {run_id: (start, ended[run_id]) for run_id, start in started.items() if run_id in ended}


async def concurrency(bench: Bench) -> list[dict[str, object]]:
    jobs = bench.scaled(JOBS, minimum=50)
    nodes = nodes_for(bench)
    busy = BusyWorkers(handler_ms=HANDLER_MS, concurrency=CONCURRENCY, processes=bench.workers)
    planned = [Offer(label="keyed", offset_s=0.0, concurrency_key=KEY, concurrency_limit=LIMIT)] * jobs
    url = await bench.fresh_database("fastlane")
    first, created, _ = await create_offers(bench, url, planned, BUSY_JOB_TYPE)
    async with FastlaneCluster(bench, url, nodes=nodes, busy=busy) as cluster:
        ready_at = await cluster.start()
        overrun = note_overrun(bench, first, ready_at)
        tail = RecordTail(cluster.record_paths)
        await wait_for_runs(tail, jobs, Deadline(3 * jobs / best_runs_per_s() + GRACE_S), bench.progress,
                            label="keyed runs started")
        await wait_until_ended(cluster.record_paths, jobs)
    tail.read()
    intervals = handler_intervals(cluster.record_paths)
    first_start = min((start for start, _ in intervals.values()), default=0)
    last_end = max((end for _, end in intervals.values()), default=0)
    elapsed_s = (last_end - first_start) / 1e6 if intervals else None
    return [system_result(
        bench, "fastlane", jobs=jobs, got=tail.deliveries(), nodes=nodes, concurrency_key=KEY,
        concurrency_limit=LIMIT, **busy.as_json(nodes), most_running_at_once=most_at_once(list(intervals.values())),
        runs_ended=len(intervals), first_start_to_last_end_s=round(elapsed_s, 2) if elapsed_s else None,
        runs_per_s=round(len(intervals) / elapsed_s, 1) if elapsed_s else None,
        best_runs_per_s=best_runs_per_s(), insert_s=round(created.seconds, 2), lead_in_overrun_s=round(overrun, 2),
    )]


async def wait_until_ended(record_paths: list[Path], jobs: int) -> None:
    """The last handlers end a handler's time after they start: wait for their end records."""
    deadline = Deadline(10.0)
    while len(handler_intervals(record_paths)) < jobs and not deadline.expired:
        await asyncio.sleep(0.05)
