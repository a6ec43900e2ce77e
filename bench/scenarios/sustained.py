"""``sustained``: the most runs per second delivered and acknowledged end to end.

20,000 interval jobs fire every second (an offered load of 20,000 runs/s, above what the target
asks), their phases spread evenly over the second. After a warm-up, the rate is the increase of
``fastlane_runs_total{outcome="succeeded"}`` over the measuring window, summed over the nodes'
metrics: a run counts once its worker's result is durable and acknowledged. An overloaded node
falls behind; the lag percentiles (of the runs scheduled inside the window that arrived before
the processes were stopped: compare ``delivered_in_window`` with ``due_in_window``) show by how
much. Occurrences a node found more than the misfire grace late are coalesced (the jobs' default
policy), so under overload ``due_in_window`` counts more than can ever arrive.
Scaled: ``20,000 x scale`` jobs, warm-up ``max(3, 10 x scale)`` s, window ``max(5, 30 x scale)`` s.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import timedelta

from fastlane.bench.cluster import FastlaneCluster
from fastlane.bench.harness import (
    CREATE_WORST_S,
    START_ALLOWANCE_S,
    Bench,
    RecordTail,
    create_phased_interval_jobs,
    micros,
    note_overrun,
    now_utc,
    sleep_until,
    system_result,
)
from fastlane.bench.scenarios import floor

JOBS = 20_000
EVERY = timedelta(seconds=1)
SUCCEEDED = 'fastlane_runs_total{outcome="succeeded"}'
MISSED = 'fastlane_occurrences_skipped_total{policy="misfire"}'


@dataclass(frozen=True, slots=True)
class Timing:
    warmup_s: float
    window_s: float

    @property
    def total(self) -> float:
        return self.warmup_s + self.window_s


def timing(bench: Bench) -> Timing:
    return Timing(warmup_s=bench.seconds(10.0, 3.0), window_s=bench.seconds(30.0, 5.0))


def budget(bench: Bench) -> float:
    own = START_ALLOWANCE_S * 2 + bench.scaled(JOBS, 10) * CREATE_WORST_S + timing(bench).total
    return own + (floor.budget(bench) if bench.floor else 0.0)


async def sustained(bench: Bench) -> list[dict[str, object]]:
    jobs = bench.scaled(JOBS, minimum=10)
    times = timing(bench)
    floor_result = await floor.floor_first(bench)  # before any daemon, on a database of its own
    url = await bench.fresh_database("fastlane")
    first, created = await create_phased_interval_jobs(bench, url, jobs, EVERY)
    async with FastlaneCluster(bench, url, nodes=bench.nodes, workers=bench.workers) as cluster:
        ready_at = await cluster.start()
        overrun = note_overrun(bench, first, ready_at)
        window_start = first + timedelta(seconds=times.warmup_s)
        await sleep_until(window_start, bench.progress, "warming up")
        before, started = await cluster.metric_total(SUCCEEDED), time.monotonic()
        meter = cluster.cpu_meter()
        meter.start()
        profiler = cluster.profiler() if bench.profile else None
        if profiler is not None:
            profiler.start()
        missed_before = await cluster.metric_total(MISSED)
        bench.progress.phase("measuring succeeded runs/s")
        while (elapsed := time.monotonic() - started) < times.window_s:
            await asyncio.sleep(min(1.0, times.window_s - elapsed))
            now_total = await cluster.metric_total(SUCCEEDED)
            rate = (now_total - before) / max(time.monotonic() - started, 1e-6)
            bench.progress.update(round(time.monotonic() - started), round(times.window_s), f"{rate:9,.0f} runs/s")
        after, ended = await cluster.metric_total(SUCCEEDED), time.monotonic()
        cpu = meter.stop(runs=int(after - before))
        profile = profiler.stop() if profiler is not None else None
        missed = await cluster.metric_total(MISSED) - missed_before
        window_end = now_utc()
    tail = RecordTail(cluster.record_paths)
    measured = round((after - before) / (ended - started), 1)
    start_us, end_us = micros(window_start), micros(window_end)
    in_window = tail.deliveries(lambda record: start_us <= record.scheduled_us < end_us)
    everything = tail.deliveries()
    result = system_result(bench, "fastlane", jobs=jobs, got=in_window,
                           offered_runs_per_s=round(jobs / EVERY.total_seconds(), 1),
                           window_s=round(ended - started, 2), succeeded_in_window=int(after - before),
                           due_in_window=round(jobs * (window_end - window_start) / EVERY),
                           insert_s=round(created.seconds, 2), lead_in_overrun_s=round(overrun, 2))
    # Delivered and duplicates over the whole run, as the workers counted them; lags are of the
    # runs scheduled inside the window.
    result["delivered_in_window"] = in_window.delivered
    result["delivered"] = everything.delivered
    result["duplicates"] = everything.duplicates
    result["runs_per_s"] = measured
    # Occurrences found beyond their misfire grace and recorded as skipped over the window: what
    # an overloaded node gives up (the jobs coalesce them into one run each).
    result["missed_in_window"] = int(missed)
    # CPU of every process over the window, per run succeeded in it; the stages of node-1.
    result["cpu"] = cpu
    if profile is not None:
        result["profile"] = profile
    floor.compare_with_floor(result, floor_result)
    return [result] if floor_result is None else [result, floor_result]
