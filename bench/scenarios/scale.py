"""``scale``: 1,000,000 stored jobs; memory per in-window job; time to rebuild a 100,000-job window.

900,000 one-shot jobs are due a month ahead (stored, never in the window); 100,000 are due at an
instant D, spread over one second, created last. Then, with no worker:

1. Memory: a node starts while D is still beyond its 10-s window, so it starts with an empty
   window; its RSS then is the *before*. When D comes within 10 s its loader reads the 100,000
   jobs into the window; its RSS once it holds them all is the *after*. Memory per in-window job
   = (after − before) / jobs held. RSS includes what the allocator keeps after the load's
   temporary rows, as an operator would see it. *Held* counts each job once, as the job planned
   (``fastlane_heap_size``) or as the run written for it (also in ``fastlane_heap_size`` until
   its instant, then in ``fastlane_ready_queue_depth``: there is no worker): a crowd this size is
   more than a small machine writes in the lead, so the node writes its runs ahead as soon as the
   jobs enter the window, and by D they may all be runs.
2. Rebuild: that node stops (handing its shards back) and a new one starts while the 100,000
   are inside the window: from starting the process to health SERVING is the rebuild time
   (``rebuild_s``; it includes interpreter start-up); the log's "acquired N shards" to "window
   rebuilt" is the load alone (``rebuild_log_s``), and the jobs and runs it loaded are
   ``rebuild_jobs`` and ``rebuild_runs`` (the runs written ahead of the crowd are loaded as runs).
3. Memory per written run: that new node goes on past D. With no worker every run, once written
   and released, waits in the ready queue; when all of them do, its RSS less the first node's RSS
   at rest (the same daemon with an empty window), over the runs, is ``bytes_per_due_run``: what a
   crowd costs the node once it is all runs (how much of it is runs when the memory of step 1 is
   read depends on how fast the machine writes: a slower one writes the crowd earlier).

Scaled: ``1,000,000 x scale`` stored jobs, ``100,000 x scale`` of them in the window.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

import orjson
from fastlane.bench.cluster import FastlaneCluster
from fastlane.bench.harness import (
    CREATE_WORST_S,
    INSERT_SAFETY,
    JOB_TYPE,
    START_ALLOWANCE_S,
    Bench,
    Deadline,
    JobWriter,
    now_utc,
    sleep_until,
)
from fastlane.bench.stats import percentiles
from fastlane.bench.usage import current_rss

from fastlane.domain.models import JobSpec, Schedule
from fastlane.engine.lane_settings import LANE_DEFAULTS

STORED_JOBS = 1_000_000
WINDOW_JOBS = 100_000
WINDOW = LANE_DEFAULTS.window  # the node's window: the jobs are read into it this long before they are due
# After the last job is created: starting the first node, settling, and still ahead of the window.
ENTER_LEAD = WINDOW + timedelta(seconds=12)
SETTLE_S = 1.0
HEAP_SIZE = "fastlane_heap_size"
READY = "fastlane_ready_queue_depth"
LOAD_DEADLINE_S = 20.0  # from the window reaching D to the node holding every job: loaded or written


def budget(bench: Bench) -> float:
    return (START_ALLOWANCE_S * 3 + bench.scaled(STORED_JOBS, 100) * CREATE_WORST_S + ENTER_LEAD.total_seconds()
            + LOAD_DEADLINE_S)  # the wait for the due runs


async def scale(bench: Bench) -> list[dict[str, object]]:
    stored = bench.scaled(STORED_JOBS, minimum=100)
    window_jobs = min(bench.scaled(WINDOW_JOBS, minimum=10), stored)
    url = await bench.fresh_database("fastlane")
    async with JobWriter(url, bench.progress) as writer:
        far = now_utc() + timedelta(days=30)
        filler = stored - window_jobs
        specs = (JobSpec(name=f"later-{index}", job_type=JOB_TYPE,
                         schedule=Schedule.at_instant(far + timedelta(seconds=index))) for index in range(filler))
        created = await writer.create(specs, filler, f"creating {filler:,} jobs due in a month")
        per_job = created.seconds / created.count if created.count else CREATE_WORST_S
        due = now_utc() + timedelta(seconds=window_jobs * per_job * INSERT_SAFETY) + ENTER_LEAD
        step = timedelta(seconds=1) / window_jobs
        specs = (JobSpec(name=f"window-{index}", job_type=JOB_TYPE, schedule=Schedule.at_instant(due + index * step))
                 for index in range(window_jobs))
        created_window = await writer.create(specs, window_jobs, f"creating {window_jobs:,} jobs due together")
    figures: dict[str, object] = {"stored_jobs": stored, "window_jobs": window_jobs,
                                  "insert_s": round(created.seconds + created_window.seconds, 2)}
    figures.update(await _memory(bench, url, due, window_jobs))
    at_rest = figures.get("rss_before_bytes")
    figures.update(await _rebuild(bench, url, window_jobs, due, at_rest if isinstance(at_rest, int) else None))
    empty = percentiles([])
    return [{"system": "fastlane", "scenario": bench.scenario, "backend": bench.backend, "jobs": stored,
             "delivered": 0, "duplicates": 0, "start_lag_ms": empty, "delivery_lag_ms": empty,
             "release_lag_ms": empty, "runs_per_s": None, **figures}]


async def _memory(bench: Bench, url: str, due: datetime, window_jobs: int) -> dict[str, object]:
    async with FastlaneCluster(bench, url, workers=0, label="fastlane-load") as cluster:
        ready_at = await cluster.start(with_workers=False)
        daemon = cluster.daemons[0]
        await asyncio.sleep(SETTLE_S)
        if due - now_utc() <= WINDOW + timedelta(seconds=0.5):
            late = (ready_at - (due - WINDOW)).total_seconds()
            bench.note(f"memory not measured: creating the jobs overran, the window jobs were already due within "
                       f"the window when the node was ready ({late:+.1f} s)")
            return {}
        before = current_rss(daemon.pid)
        await sleep_until(due - WINDOW, bench.progress, "waiting for the jobs to enter the window")
        bench.progress.phase("loading the window")
        deadline = Deadline(LOAD_DEADLINE_S)
        held = 0.0
        while not deadline.expired:
            held = await cluster.metric_total(HEAP_SIZE) + await cluster.metric_total(READY)
            bench.progress.update(int(held), window_jobs)
            if held >= window_jobs:
                break
            await asyncio.sleep(0.1)
        bench.progress.end()
        await asyncio.sleep(0.5)  # let the loader's batch finish allocating
        after = current_rss(daemon.pid)
    if held < window_jobs:
        bench.note(f"only {held:,.0f} of {window_jobs:,} jobs entered the window in time")
    figures: dict[str, object] = {"rss_before_bytes": before, "rss_after_bytes": after, "jobs_in_window": int(held)}
    if before is not None and after is not None and held:
        # The two gauges are read one after the other: a run released between the reads counts
        # twice, so no more jobs than were created are divided by.
        figures["bytes_per_window_job"] = round((after - before) / min(held, window_jobs), 1)
    return figures


async def _rebuild(
    bench: Bench, url: str, window_jobs: int, due: datetime, at_rest: int | None
) -> dict[str, object]:
    async with FastlaneCluster(bench, url, workers=0, label="fastlane-rebuild") as cluster:
        await cluster.start(with_workers=False)
        assert cluster.started_at is not None and cluster.ready_at is not None
        rebuild_s = (cluster.ready_at - cluster.started_at).total_seconds()
        log_path = cluster.daemons[0].log_path
        due_runs = await _due_runs_memory(bench, cluster, due, window_jobs, at_rest)
    figures: dict[str, object] = {"rebuild_s": round(rebuild_s, 3), **due_runs}
    acquired, rebuilt, loaded = _rebuild_events(log_path)
    if acquired and rebuilt:
        figures["rebuild_log_s"] = round((rebuilt - acquired).total_seconds(), 3)
    if loaded is not None:
        jobs, runs = loaded
        figures["rebuild_jobs"], figures["rebuild_runs"] = jobs, runs
        if jobs + runs < window_jobs:
            bench.note(f"the rebuilt window held {jobs:,} jobs and {runs:,} runs, not {window_jobs:,}")
    return figures


async def _due_runs_memory(
    bench: Bench, cluster: FastlaneCluster, due: datetime, window_jobs: int, at_rest: int | None
) -> dict[str, object]:
    """Once every run of the crowd waits in the ready queue (there is no worker): the node's RSS."""
    await sleep_until(due + timedelta(seconds=1), bench.progress, "waiting for the instant to pass")
    bench.progress.phase("waiting for every run to be written and released")
    deadline = Deadline(LOAD_DEADLINE_S)
    ready = 0.0
    while not deadline.expired:
        ready = await cluster.metric_total(READY)
        bench.progress.update(int(ready), window_jobs)
        if ready >= window_jobs:
            break
        await asyncio.sleep(0.1)
    bench.progress.end()
    if ready < window_jobs:
        bench.note(f"only {ready:,.0f} of {window_jobs:,} runs reached the ready queue in time")
        return {}
    await asyncio.sleep(0.5)  # as for the jobs: let the last batch finish allocating
    rss = current_rss(cluster.daemons[0].pid)
    figures: dict[str, object] = {"rss_due_runs_bytes": rss}
    if rss is not None and at_rest is not None:
        figures["bytes_per_due_run"] = round((rss - at_rest) / window_jobs, 1)
    return figures


def _rebuild_events(path: Path) -> tuple[datetime | None, datetime | None, tuple[int, int] | None]:
    """From a node's JSON log: when it acquired its first shards, when the window was rebuilt, and
    how many jobs and runs it loaded ("window rebuilt for N shards: J jobs due, R runs pending")."""
    acquired = rebuilt = None
    loaded = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        message = str(entry.get("msg", ""))
        stamp = datetime.fromisoformat(str(entry.get("ts", "")).replace("Z", "+00:00")) if entry.get("ts") else None
        if acquired is None and message.startswith("acquired "):
            acquired = stamp
        elif rebuilt is None and message.startswith("window rebuilt"):
            rebuilt = stamp
            words = message.split(": ", 1)[-1].replace(",", " ").split()
            numbers = [int(word) for word in words if word.isdigit()]
            loaded = (numbers[0], numbers[1]) if len(numbers) >= 2 else None
    return acquired, rebuilt, loaded
