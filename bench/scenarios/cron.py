"""``cron``: 100,000 cron jobs firing together every minute (``* * * * *``), over two firings.

Every firing is a burst of all the jobs at one instant, again and again. Cron jobs get their
first fire time when created, so creating them takes minutes during which some of those times
pass: the node fires those late once at start-up (its misfire policy). That catch-up is left
out: measuring starts at the first firing after the runs have gone quiet, and covers the runs
scheduled at the next ``FIRINGS`` firings.

Scaled: ``100,000 x scale`` jobs; below scale 1 a seconds-level expression ``*/P * * * * *``
whose period P is the divisor of 60 nearest above ``60 x scale`` (at least 5 s), so a quick run
does not wait for minutes.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from fastlane.bench.cluster import FastlaneCluster
from fastlane.bench.harness import (
    CREATE_WORST_S,
    JOB_TYPE,
    START_ALLOWANCE_S,
    Bench,
    Deadline,
    JobWriter,
    RecordTail,
    micros,
    now_utc,
    system_result,
    wait_for_runs,
)
from fastlane.bench.stats import RunRecord, runs_per_second

from fastlane.domain.models import JobSpec, Schedule

JOBS = 100_000
FIRINGS = 2
MINUTE_PERIODS = (5, 6, 10, 12, 15, 20, 30, 60)  # divisors of 60: every firing lands on the same seconds
QUIET_S = 1.0  # no new run for this long: the start-up catch-up is over


def period_s(scale: float) -> int:
    """The firing period: 60 s at full scale, shorter for a scaled-down run."""
    wanted = 60 * scale
    return next((period for period in MINUTE_PERIODS if period >= wanted), 60)


def expression(period: int) -> str:
    return "* * * * *" if period == 60 else f"*/{period} * * * * *"


def budget(bench: Bench) -> float:
    return START_ALLOWANCE_S * 2 + bench.scaled(JOBS, 10) * CREATE_WORST_S + period_s(bench.scale) * (FIRINGS + 4)


def next_boundary(after: datetime, period: int) -> datetime:
    """The first firing instant strictly after ``after``."""
    seconds = int(after.timestamp()) // period * period + period
    return datetime.fromtimestamp(seconds, UTC)


async def cron(bench: Bench) -> list[dict[str, object]]:
    jobs = bench.scaled(JOBS, minimum=10)
    period = period_s(bench.scale)
    cron_text = expression(period)
    url = await bench.fresh_database("fastlane")
    async with JobWriter(url, bench.progress) as writer:
        specs = (JobSpec(name=f"cron-{index}", job_type=JOB_TYPE, schedule=Schedule.cron_expr(cron_text, "UTC"))
                 for index in range(jobs))
        created = await writer.create(specs, jobs, f"creating {jobs:,} cron jobs ({cron_text})")
    async with FastlaneCluster(bench, url, nodes=bench.nodes, workers=bench.workers) as cluster:
        await cluster.start()
        tail = RecordTail(cluster.record_paths)
        await _wait_quiet(bench, tail, limit=period)
        first = next_boundary(now_utc() + timedelta(seconds=1), period)
        last = first + (FIRINGS - 1) * timedelta(seconds=period)
        low, high = micros(first), micros(last)

        def measured(record: RunRecord) -> bool:
            return low <= record.scheduled_us <= high

        deadline = Deadline((last - now_utc()).total_seconds() + period)
        await wait_for_runs(tail, jobs * FIRINGS, deadline, bench.progress, keep=measured,
                            label=f"runs of {FIRINGS} firings received")
    got = tail.deliveries(measured)
    everything = tail.deliveries()
    # Per firing: from its instant to its last run received; the drain rate over those spans.
    spans = []
    for instant in range(low, high + 1, period * 1_000_000):
        received = [record.received_us for record in got.first if record.scheduled_us == instant]
        if received:
            spans.append((max(received) - instant) / 1e6)
    result = system_result(bench, "fastlane", jobs=jobs, got=got, cron=cron_text, firings=FIRINGS,
                           last_delivery_after_instant_s=round(max(spans), 4) if spans else None,
                           insert_s=round(created.seconds, 2))
    result["runs_per_s"] = runs_per_second(got.delivered, sum(spans) if spans else None)
    result["expected"] = jobs * FIRINGS
    result["duplicates"] = everything.duplicates
    if got.delivered < jobs * FIRINGS:
        bench.note(f"fastlane delivered {got.delivered:,} of the {jobs * FIRINGS:,} runs of the measured firings")
    return [result]


async def _wait_quiet(bench: Bench, tail: RecordTail, *, limit: float) -> None:
    """Until no run has arrived for a moment (the start-up catch-up is over), at most ``limit`` s."""
    bench.progress.phase("letting the start-up catch-up settle")
    started = quiet_since = time.monotonic()
    count = tail.read()
    while time.monotonic() - started < limit:
        await asyncio.sleep(0.2)
        now_count = tail.read()
        if now_count != count:
            count, quiet_since = now_count, time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_S:
            break
        bench.progress.update(count, None, "catch-up runs")
    bench.progress.end()
