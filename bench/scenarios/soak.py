"""``soak``: a node that runs for hours under a steady mix of work and recurring faults, and does not grow.

One node and two workers run for ``--hours`` (a quick check by default; an hour for the record)
under a steady load of about 135 runs a second:

- 200 interval jobs every 2 s, their phases spread over the period (100 runs/s);
- 120 cron jobs ``*/5 * * * * *``, all due on the same second (24 runs/s, in bursts);
- one-shot jobs created through the API, 10 a second, each due 2 s after it was asked for;
- a three-step workflow chain (``a → b → c``) triggered every 5 s, run by a second worker.

Every periodic job fires all the occurrences it misses (``fire_all``), so each one must run.
History retention is on at its shortest (one hour), over 100,000 runs seeded 40 days old that
the node trims while it works. In every slice the no-op worker is SIGKILLed and started again (a
third of the way in), and on PostgreSQL the server is restarted (``pg_ctl restart -m fast``, two
thirds of the way in).

The soak is cut into slices: five minutes each for a run of half an hour or more, else a sixth
of it (at least 20 s). Per slice: the node's RSS, open files, threads and database connections
(the largest of the samples taken every 5 s outside fault windows; the open files and connections
held during faults are reported apart), its event-loop lag p99 and p99.9 (its histogram),
the start-lag p99 and max of the runs due in it, and that p99 again without the runs due inside a
fault's window (from the fault until 15 s after the system is whole again). When the load stops
the periodic jobs are paused and the last runs drain; then every occurrence is accounted for.

Targets: each resource's maximum in every later slice within 5 % of the first slice's after the
warm-up (the second slice: the first trims the seeded history and fills the caches); the
last slice's start-lag p99 (outside fault windows) within 10 % of the first's; nothing lost and
nothing run twice (a run whose handler is entered again after its worker was killed is counted
apart: that is a retry of one run, not a second run).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import asyncpg
import grpc
from fastlane.bench.cluster import WORKER_CONCURRENCY, WORKER_TARGET
from fastlane.bench.harness import JOB_TYPE, SHARDS, START_ALLOWANCE_S, Bench, Deadline, micros, now_utc
from fastlane.bench.processes import Daemon, WorkerProcess, child_environment
from fastlane.bench.soak_figures import (
    FaultWindow,
    ResourceSamples,
    Slicing,
    account,
    drift,
    growth,
    periodic_instants,
    read_occurrences,
    rss_slope_mib_per_hour,
    slice_rows,
    slicing_for,
    workflow_steps,
)
from fastlane.bench.stats import histogram_quantiles, stall_causes
from fastlane.bench.usage import current_rss, files_open_under, open_files, peak_rss, thread_count

from fastlane.client import Client
from fastlane.domain.models import JobSpec, MisfireKind, MisfirePolicy, Schedule
from fastlane.errors import RemoteError
from fastlane.testing.history import seed_old_history

DEFAULT_HOURS = 0.1
INTERVAL_JOBS = 200
INTERVAL_EVERY_S = 2
CRON_JOBS = 120
CRON_PERIOD_S = 5
CRON = f"*/{CRON_PERIOD_S} * * * * *"
ONE_SHOTS_PER_S = 10
ONE_SHOT_LEAD_S = 2.0
WORKFLOW = "soak-chain"
WORKFLOW_STEPS = {"a": [], "b": ["a"], "c": ["b"]}
WORKFLOW_EVERY_S = 5.0
WORKFLOW_JOB_TYPE = "bench.step"  # what bench/workflow_worker.py serves
SAMPLE_EVERY_S = 5.0
FAULT_SETTLE_S = 15.0
OLD_RUNS = 100_000
OLD_AGE = timedelta(days=40)
RETENTION_DAYS = "0.04167"  # the shortest retention the node takes (one hour), rounded up
LEAD_S = 15.0  # from starting to create the periodic jobs to their first instant
DRAIN_S = 120.0  # the most the last runs are waited for once the load stops
QUIET_S = 5.0  # the records have drained when they have not grown for this long
# A run a killed worker had been sent is dispatched again once its attempt's lease expires (the
# node cannot know whether the handler began): the drain waits that long after the last fault.
RUN_LEASE_S = next(spec.default for spec in fields(JobSpec) if spec.name == "lease_ttl").total_seconds()
RETRY_S = 0.2  # between attempts of a call the node refused while its database was away
RETRY_FOR_S = 120.0  # the longest a call is retried: far longer than a restart takes
RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED})
TRIMMED = "fastlane_history_trimmed_total"
LOOP_LAG = "fastlane_event_loop_lag_seconds"
STALLS = "fastlane_event_loop_stalls_total"
FIRE_ALL = MisfirePolicy(kind=MisfireKind.FIRE_ALL)
T = TypeVar("T")


def hours(bench: Bench) -> float:
    return bench.hours if bench.hours is not None else DEFAULT_HOURS


def budget(bench: Bench) -> float:
    return hours(bench) * 3600 + 2 * START_ALLOWANCE_S + DRAIN_S + OLD_RUNS * 0.0002 + 120


@dataclass(slots=True)
class Load:
    """What the load generators asked for: the occurrences that must run."""

    one_shots: dict[str, int] = field(default_factory=dict)  # job id: its instant (µs)
    workflow_runs: list[str] = field(default_factory=list)
    refused_calls: int = 0  # calls retried because the node could not serve them (its database away)


async def soak(bench: Bench) -> list[dict[str, object]]:
    duration_s = hours(bench) * 3600
    url = await bench.fresh_database("soak")
    bench.progress.phase(f"seeding {OLD_RUNS:,} runs that finished {OLD_AGE.days} days ago")
    await seed_old_history(url, OLD_RUNS, OLD_AGE)
    work = bench.workdir
    node = Daemon(url, work / "soak-node.log", shards=SHARDS, extra_args=["--history-retention", RETENTION_DAYS])
    record, steps_record = work / "soak-received-1.txt", work / "soak-received-steps.txt"
    noop = WorkerProcess(WORKER_TARGET, [node.address], work / "soak-worker.log", concurrency=WORKER_CONCURRENCY,
                         env=child_environment(FASTLANE_BENCH_RECORD=str(record)),
                         extra_args=bench.worker_scheduling_args())
    stepper = WorkerProcess("fastlane.bench.workflow_worker:worker", [node.address], work / "soak-step-worker.log",
                            env=child_environment(FASTLANE_BENCH_RECORD=str(steps_record)),
                            extra_args=bench.worker_scheduling_args())
    try:
        node.start()
        await node.wait_ready(timeout=START_ALLOWANCE_S)
        noop.start()
        stepper.start()
        async with Client(node.address) as client:
            await _wait_workers(node, 2)
            first = _whole_second(now_utc() + timedelta(seconds=LEAD_S))
            periodic = await _create_periodic(client, first, bench)
            await client.create_workflow({"name": WORKFLOW, "steps": [
                {"name": name, "job_type": WORKFLOW_JOB_TYPE, "after": parents} for name, parents in WORKFLOW_STEPS.items()]})
            if now_utc() >= first:  # a job made after its first instant never had it: it would count as lost
                raise RuntimeError(f"creating the jobs took more than {LEAD_S:g} s, past their first instant")
            slicing = slicing_for(micros(first), duration_s)
            bench.progress.phase(f"soaking: {slicing.count} slices of {slicing.seconds:g} s")
            run = _Soak(bench, node, noop, slicing, url)
            end = datetime.fromtimestamp(slicing.end_us / 1e6, UTC)
            await run.until(end, client)
            if len(run.scrapes) == slicing.count:  # the scrape at the end, if the end came first
                run.scrapes.append(await asyncio.to_thread(node.metrics))
            bench.progress.phase("load stopped: pausing the periodic jobs, draining the last runs")
            for job_id in periodic:
                await _retrying(lambda job_id=job_id: client.pause_job(job_id), run.load)  # bounded: RETRY_FOR_S
            last_fault = max((fault.end_us for fault in run.faults), default=0)
            await _drain(record, steps_record, not_before_us=last_fault + round((RUN_LEASE_S + QUIET_S) * 1e6))
        node_rss_peak = peak_rss(node.pid)
    finally:
        noop.stop()
        stepper.stop()
        node.stop()
    return [_figures(bench, run, periodic, record, steps_record, node_rss_peak)]


def _figures(bench: Bench, run: _Soak, periodic: dict[str, tuple[int, int]], record: Path, steps_record: Path,
             node_rss_peak: int | None) -> dict[str, object]:
    """The soak's result: every occurrence accounted for, the slices' figures, growth and drift."""
    slicing = run.slicing
    found = read_occurrences(_lines(record), slicing, run.faults)
    expected: dict[str, range | list[int]] = {
        job_id: periodic_instants(phase, period, slicing.start_us, slicing.end_us)
        for job_id, (phase, period) in periodic.items()
    }
    expected.update({job_id: [at] for job_id, at in run.load.one_shots.items() if at < slicing.end_us})
    accounting = account(expected, found)
    ended, steps_twice = workflow_steps(_lines(steps_record))
    steps_expected = len(run.load.workflow_runs) * len(WORKFLOW_STEPS)
    steps_lost = sum(1 for wf in run.load.workflow_runs for step in WORKFLOW_STEPS if (wf, step) not in ended)
    loop_lag = [histogram_quantiles(before, after, LOOP_LAG, {"p99": 0.99, "p999": 0.999})
                for before, after in zip(run.scrapes, run.scrapes[1:], strict=False)]
    trimmed = [after.get(TRIMMED, 0.0) - before.get(TRIMMED, 0.0)
               for before, after in zip(run.scrapes, run.scrapes[1:], strict=False)]
    rows = slice_rows(slicing, run.resources, run.faults, found, loop_lag, trimmed)
    result: dict[str, object] = {
        "system": "fastlane", "scenario": "soak", "backend": bench.backend, "hours": hours(bench),
        "slice_s": slicing.seconds, "slices": rows,
        "occurrences_expected": accounting.expected, "lost": accounting.lost, "twice": accounting.twice,
        "lost_examples": list(accounting.examples), "started_again_after_a_kill": found.started_again,
        "workflow_runs": len(run.load.workflow_runs), "workflow_steps_expected": steps_expected,
        "workflow_steps_lost": steps_lost, "workflow_steps_twice": steps_twice,
        "one_shots": len(run.load.one_shots), "calls_retried": run.load.refused_calls,
        "faults": {kind: sum(1 for fault in run.faults if fault.kind == kind) for kind in ("worker", "postgres")},
        "growth": {name: growth(rows, name) for name in ("rss_bytes", "open_files", "threads", "db_connections")},
        "rss_slope_mib_per_h": rss_slope_mib_per_hour(rows, slicing.seconds),
        "start_lag_drift": drift(rows), "node_peak_rss_bytes": node_rss_peak,
    }
    if len(run.scrapes) >= 2:
        result["stall_causes"] = stall_causes(run.scrapes[0], run.scrapes[-1], STALLS)
    return result


class _Soak:
    """The load, the faults and the samples of one soak, until its end."""

    def __init__(self, bench: Bench, node: Daemon, noop: WorkerProcess, slicing: Slicing, url: str) -> None:
        self.bench, self.node, self.noop, self.slicing = bench, node, noop, slicing
        self.load = Load()
        self.faults: list[FaultWindow] = []
        self.resources = ResourceSamples(slicing)
        self.scrapes: list[dict[str, float]] = []  # the node's metrics at each slice's start, and at the end
        self._url = url

    async def until(self, end: datetime, client: Client) -> None:
        tasks = [asyncio.create_task(coroutine) for coroutine in (
            self._one_shots(client, end), self._workflows(client, end), self._sample(end),
            self._slice_scrapes(), self._faults())]
        try:
            while (left := (end - now_utc()).total_seconds()) > 0:
                done = round((now_utc() - self._start).total_seconds())
                self.bench.progress.update(max(done, 0), round(self.slicing.count * self.slicing.seconds),
                                           f"{len(self.faults)} faults, {len(self.load.one_shots):,} one-shots")
                await asyncio.sleep(min(1.0, left))
                for task in tasks:
                    if task.done() and (error := task.exception()) is not None:
                        raise error
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def _start(self) -> datetime:
        return datetime.fromtimestamp(self.slicing.start_us / 1e6, UTC)

    def _at(self, index: int, fraction: float) -> datetime:
        return self._start + timedelta(seconds=(index + fraction) * self.slicing.seconds)

    async def _one_shots(self, client: Client, end: datetime) -> None:
        started = time.monotonic()
        for count in range(1_000_000_000):
            await asyncio.sleep(max(0.0, started + count / ONE_SHOTS_PER_S - time.monotonic()))
            if now_utc() >= end:
                return

            # Made once: a retry sends the same job, which the node creates once (a repeat of an
            # existing job's name and spec returns that job).
            at = now_utc() + timedelta(seconds=ONE_SHOT_LEAD_S)
            spec = JobSpec(name=f"once-{count}", job_type=JOB_TYPE, schedule=Schedule.at_instant(at))
            job, _ = await _retrying(lambda spec=spec: client.create_job(spec), self.load)
            self.load.one_shots[job.job_id] = micros(at)

    async def _workflows(self, client: Client, end: datetime) -> None:
        index = 0
        while now_utc() < end:
            run = await _retrying(lambda index=index: client.trigger_workflow(WORKFLOW, {"index": index}), self.load)
            self.load.workflow_runs.append(run.workflow_run_id)
            index += 1
            await asyncio.sleep(WORKFLOW_EVERY_S)

    async def _sample(self, end: datetime) -> None:
        while now_utc() < end:
            pid = self.node.pid
            sample = {"rss_bytes": current_rss(pid), "open_files": open_files(pid), "threads": thread_count(pid),
                      "db_connections": await self._connections(pid)}
            self.resources.add(micros(now_utc()), sample)
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def _connections(self, pid: int | None) -> int | None:
        """The node's sessions on PostgreSQL; on SQLite, the database files it holds open."""
        pg = self.bench.pg
        if pg is None:
            return files_open_under(pid, self._url.removeprefix("sqlite:///"))
        assert pg.dsn is not None
        try:
            connection = await asyncpg.connect(pg.dsn, timeout=5)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return None  # the server is restarting: this sample says nothing of the node
        try:
            found = await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'",  # not autovacuum's workers on the same database
                url_database(self._url))
            return int(found)
        finally:
            await connection.close()

    async def _slice_scrapes(self) -> None:
        for index in range(self.slicing.count + 1):
            await _sleep_until(self._at(index, 0.0))
            self.scrapes.append(await asyncio.to_thread(self.node.metrics))

    async def _faults(self) -> None:
        for index in range(self.slicing.count):
            await _sleep_until(self._at(index, 1 / 3))
            self.bench.progress.phase(f"slice {index + 1}: killing the worker and starting it again")
            started = micros(now_utc())
            self.noop.kill()
            await _wait_workers(self.node, 1, at_most=True)  # the node has seen it go ...
            self.noop.start()
            await _wait_workers(self.node, 2)  # ... and the new one come
            self.faults.append(FaultWindow("worker", started, micros(now_utc()) + round(FAULT_SETTLE_S * 1e6)))
            if self.bench.pg is not None:
                await _sleep_until(self._at(index, 2 / 3))
                self.bench.progress.phase(f"slice {index + 1}: restarting PostgreSQL")
                started = micros(now_utc())
                await asyncio.to_thread(self.bench.pg.restart, "fast")
                await self.node.wait_ready(timeout=START_ALLOWANCE_S)
                self.faults.append(FaultWindow("postgres", started, micros(now_utc()) + round(FAULT_SETTLE_S * 1e6)))


async def _create_periodic(client: Client, first: datetime, bench: Bench) -> dict[str, tuple[int, int]]:
    """The interval and cron jobs; per job id, the phase and period of its instants (µs)."""
    bench.progress.phase(f"creating {INTERVAL_JOBS} interval and {CRON_JOBS} cron jobs")
    periodic: dict[str, tuple[int, int]] = {}
    phase = timedelta(seconds=INTERVAL_EVERY_S) / INTERVAL_JOBS
    for index in range(INTERVAL_JOBS):
        anchor = first + index * phase
        job, _ = await client.create_job(JobSpec(
            name=f"every-{index}", job_type=JOB_TYPE, misfire=FIRE_ALL,
            schedule=Schedule.interval(timedelta(seconds=INTERVAL_EVERY_S), anchor=anchor)))
        periodic[job.job_id] = (micros(anchor), INTERVAL_EVERY_S * 1_000_000)
    for index in range(CRON_JOBS):
        job, _ = await client.create_job(JobSpec(name=f"cron-{index}", job_type=JOB_TYPE, misfire=FIRE_ALL,
                                                 schedule=Schedule.cron_expr(CRON)))
        periodic[job.job_id] = (0, CRON_PERIOD_S * 1_000_000)  # on the seconds divisible by the period
    return periodic


async def _retrying(call: Callable[[], Awaitable[T]], load: Load) -> T:
    """A client call, again after a short pause while the node cannot serve it (its database
    restarting), for RETRY_FOR_S at most: the load goes on as a client's would. Any other error
    ends the soak."""
    deadline = Deadline(RETRY_FOR_S)
    while True:
        try:
            return await call()
        except RemoteError as error:
            if error.code not in RETRIED or deadline.expired:
                raise
            load.refused_calls += 1
            await asyncio.sleep(RETRY_S)


async def _wait_workers(node: Daemon, wanted: int, *, at_most: bool = False) -> None:
    """Until ``wanted`` workers (or, ``at_most``, no more than that) are connected to the node."""
    deadline = Deadline(START_ALLOWANCE_S)
    while True:
        connected = await asyncio.to_thread(lambda: node.metrics().get("fastlane_workers_connected", 0.0))
        if (connected <= wanted) if at_most else (connected >= wanted):
            return
        if deadline.expired:
            raise RuntimeError(f"the node did not have {'at most ' if at_most else ''}{wanted} workers in time")
        await asyncio.sleep(0.1)


async def _drain(*records: Path, not_before_us: int) -> None:
    """Until the workers' records have not grown for QUIET_S and ``not_before_us`` has passed (or
    DRAIN_S has)."""
    deadline = Deadline(DRAIN_S)
    sizes: tuple[int, ...] = ()
    quiet_since = time.monotonic()
    while not deadline.expired:
        now = tuple(path.stat().st_size if path.exists() else 0 for path in records)
        if now != sizes:
            sizes, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_S and micros(now_utc()) >= not_before_us:
            return
        await asyncio.sleep(0.5)


async def _sleep_until(instant: datetime) -> None:
    await asyncio.sleep(max(0.0, (instant - now_utc()).total_seconds()))


def _whole_second(instant: datetime) -> datetime:
    return datetime.fromtimestamp(math.ceil(instant.timestamp()), UTC)


def _lines(path: Path) -> Iterable[str]:
    if path.exists():
        with path.open() as lines:
            yield from lines


def url_database(url: str) -> str:
    """The database name of a PostgreSQL URL (the last path segment, before any query)."""
    return url.rsplit("/", 1)[-1].split("?", 1)[0]

