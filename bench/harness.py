"""What every scenario needs: the run's context, a progress bar, time limits, worker records,
process memory, and creating many jobs fast through the store.

Jobs are created through ``open_store(url).jobs.create_job`` from the harness process *before* any
daemon starts: that measures trigger lag, not API load (creating tens of thousands of jobs over
gRPC would take longer than the measurement). Several creates run at once on PostgreSQL; SQLite
serialises its writes anyway.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from fastlane.bench.pgcluster import ThrowawayPostgres, create_database
from fastlane.bench.stats import (
    Deliveries,
    RunRecord,
    deliveries,
    delivery_span_s,
    late_starts_waiting_for_cpu,
    parse_record,
    percentiles,
    runs_per_second,
)
from fastlane.bench.usage import ProcessMemory

from fastlane.domain.models import DEFAULT_TENANT, Job, JobSpec, Schedule
from fastlane.runtime.clock import to_micros
from fastlane.storage import open_store

SHARDS = 64  # the product's default shard count
JOB_TYPE = "bench.noop"
# The first runs are due this long after the processes start: they start, rebuild the window
# (work due within the node's 10 s window is loaded at start-up) and workers connect meanwhile.
LAUNCH_LEAD = timedelta(seconds=4)
LAUNCH_LEAD_PER_EXTRA_NODE = timedelta(seconds=2)
CALIBRATION_JOBS = 200
INSERT_SAFETY = 1.6  # planned insert time = measured rate x this: creation slows as the database grows, and too
# small a margin starts the processes after the first runs are due (lead_in_overrun_s says by how much)
CREATE_WORST_S = 1 / 200  # a bound on creating one job through the store, for hard deadlines only
START_ALLOWANCE_S = 120.0  # a bound on starting and stopping the processes, for hard deadlines only
JOB_CREATION = "through the store (open_store(url).jobs.create_job) before the daemon started, not through the API"
# The scenarios that create their jobs and workflows as a user would, while the node runs.
THROUGH_API = "through the API (the Python client) while the node runs"
SCENARIOS_THROUGH_API = ("soak", "workflow")


class BenchTimeout(Exception):
    """A scenario ran past its hard deadline."""


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a plain line now and then otherwise.

    Without a terminal (a log, a CI run, a test) each phase prints a line every
    ``log_interval`` seconds and one when it ends, so the output stays readable.
    """

    def __init__(self, stream: TextIO | None = None, *, width: int = 30, interval: float = 0.2,
                 log_interval: float = 10.0) -> None:
        self._stream = stream or sys.stderr
        self._live = self._stream.isatty()
        self._width = width
        self._interval = interval if self._live else log_interval
        self._label = ""
        self._started = time.monotonic()
        self._drawn_at = 0.0
        self._last = ""
        self._drawn = ""
        self._open = False

    def phase(self, label: str) -> None:
        """End the current phase and start a new one."""
        self.end()
        self._label = label
        self._started = self._drawn_at = time.monotonic()
        self._last = ""
        self._open = True
        if self._live:
            self._draw(self._line(0, None, ""))

    def update(self, done: int, total: int | None, detail: str = "", *, force: bool = False) -> None:
        """Show ``done`` of ``total`` (a count alone when the total is unknown)."""
        self._open = True
        self._last = self._line(done, total, detail)
        now = time.monotonic()
        # Off a terminal the end of the phase prints the final state: no need to force it here.
        if (force and self._live) or now - self._drawn_at >= self._interval:
            self._drawn_at = now
            self._draw(self._last)

    def end(self) -> None:
        """Finish the phase's line."""
        if not self._open:
            return
        if self._live:
            self._stream.write("\n")
        elif (final := self._last or self._line(0, None, "")) != self._drawn:
            self._stream.write(f"{final}\n")
        self._stream.flush()
        self._open = False

    def _line(self, done: int, total: int | None, detail: str) -> str:
        if total:
            filled = min(self._width, self._width * done // total)
            bar = f"[{'#' * filled}{'.' * (self._width - filled)}] {done:,}/{total:,}"
        else:
            bar = f"{done:,}" if done else ""
        elapsed = f"{time.monotonic() - self._started:5.1f} s"
        return "  ".join(part for part in (f"{self._label:<34}", bar, detail, elapsed) if part)

    def _draw(self, line: str) -> None:
        self._drawn = line
        self._stream.write(f"\r{line}\x1b[K" if self._live else f"{line}\n")
        self._stream.flush()


@dataclass(kw_only=True)
class Bench:
    """One run of the command: its options, scratch directory, database cluster and findings."""

    scenario: str
    backend: str
    nodes: int
    workers: int
    scale: float
    workdir: Path
    peer: bool = True
    secure: bool = False  # spread and burst: run fastlane again with TLS and an API token
    durable: bool = False  # postgres: fsync, synchronous commits and full page writes on (DURABLE_SETTINGS)
    # SCHED_FIFO priority of the event-loop threads that start runs (fastlane's workers, the peer's
    # scheduler) while they fire; 0: normal scheduling.
    realtime_priority: int = 1
    floor: bool = False  # sustained and burst: measure the database's floor first (bench/scenarios/floor.py)
    profile: bool = False  # sustained and burst: sample node-1's stacks with py-spy (bench/profile.py)
    hours: float | None = None  # soak: how long it runs (None: its quick default)
    pg: ThrowawayPostgres | None = None
    progress: Progress = field(default_factory=Progress)
    notes: list[str] = field(default_factory=list)
    memory: list[ProcessMemory] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)  # delivery (and start) lags (ms), for the plot
    _databases: int = 0

    def scaled(self, full: int, minimum: int = 1) -> int:
        return max(minimum, round(full * self.scale))

    def seconds(self, full: float, minimum: float) -> float:
        return max(minimum, full * self.scale)

    @property
    def launch_lead(self) -> timedelta:
        """How long before the first due run the processes are started."""
        return LAUNCH_LEAD + (self.nodes - 1) * LAUNCH_LEAD_PER_EXTRA_NODE

    def worker_scheduling_args(self) -> list[str]:
        """``fastlane worker`` flags for the scheduling of the workers' event loops."""
        return ["--realtime-priority", str(self.realtime_priority)] if self.realtime_priority else []

    def note(self, text: str) -> None:
        self.notes.append(text)

    async def fresh_database(self, name: str) -> str:
        """The URL of a new, empty database for one system under test."""
        self._databases += 1
        if self.pg is None:
            return f"sqlite:///{self.workdir / f'{name}.db'}"
        assert self.pg.dsn is not None
        return await create_database(self.pg.dsn, f"{name}_{self._databases}")


# -- time ----------------------------------------------------------------------------------------


def now_utc() -> datetime:
    return datetime.now(UTC)


def micros(instant: datetime) -> int:
    """Microseconds since the epoch, exactly as the workers write them."""
    return to_micros(instant)


async def sleep_until(instant: datetime, progress: Progress | None = None, label: str = "") -> None:
    """Sleep until the wall-clock ``instant`` (at once if it has passed), showing a countdown."""
    if progress is not None and label:
        progress.phase(label)
    while (left := (instant - now_utc()).total_seconds()) > 0:
        if progress is not None:
            progress.update(0, None, f"{left:4.1f} s to go")
        await asyncio.sleep(min(left, 0.2))


class Deadline:
    """A monotonic deadline for one wait; ``expired`` once it has passed."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    @property
    def remaining(self) -> float:
        return max(self.at - time.monotonic(), 0.0)

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at


# -- worker records ---------------------------------------------------------------------------------


class RecordTail:
    """Follows the record files the workers append to, parsing only what is new on each read."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = paths
        self._offsets = [0] * len(paths)
        self._partial = [b""] * len(paths)
        self.records: list[RunRecord] = []

    def read(self) -> int:
        """Parse what was appended since the last call; the number of records now held."""
        for index, path in enumerate(self._paths):
            try:
                with open(path, "rb") as handle:
                    handle.seek(self._offsets[index])
                    chunk = handle.read()
            except FileNotFoundError:
                continue
            self._offsets[index] += len(chunk)
            data = self._partial[index] + chunk
            lines = data.split(b"\n")
            self._partial[index] = lines.pop()  # an unfinished last line waits for its end
            for line in lines:
                record = parse_record(line.decode(errors="replace"))
                if record is not None:
                    self.records.append(record)
        return len(self.records)

    def deliveries(self, keep: Callable[[RunRecord], bool] | None = None) -> Deliveries:
        self.read()
        return deliveries(record for record in self.records if keep is None or keep(record))


async def wait_for_runs(tail: RecordTail, expected: int, deadline: Deadline, progress: Progress,
                        keep: Callable[[RunRecord], bool] | None = None, label: str = "runs received") -> int:
    """Poll the records until ``expected`` distinct runs (matching ``keep``) arrived or the deadline
    passes; returns how many did. Only new records are looked at on each poll."""
    progress.phase(label)
    seen: set[str] = set()
    looked_at = 0
    while True:
        tail.read()
        for record in tail.records[looked_at:]:
            if keep is None or keep(record):
                seen.add(record.run_id)
        looked_at = len(tail.records)
        progress.update(len(seen), expected, f"{deadline.remaining:5.0f} s left")
        if len(seen) >= expected or deadline.expired:
            progress.update(len(seen), expected, force=True)
            return len(seen)
        await asyncio.sleep(0.1)


# -- creating jobs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Created:
    count: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")


class JobWriter:
    """Creates jobs through the store, several at a time on PostgreSQL, with a progress bar."""

    def __init__(self, url: str, progress: Progress) -> None:
        self._url = url
        self._progress = progress
        self._store = open_store(url, shard_count=SHARDS)
        self._parallel = 1 if url.startswith("sqlite") else 8

    async def __aenter__(self) -> JobWriter:
        await self._store.migrate()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._store.close()

    async def create(self, specs: Iterator[JobSpec], count: int, label: str, *,
                     on_created: Callable[[Job], None] | None = None) -> Created:
        """Create ``count`` jobs from ``specs``; returns how long it took. ``on_created`` sees each
        job as stored (its id is known only then)."""
        self._progress.phase(label)
        started = time.monotonic()
        done = 0

        async def feed() -> None:
            nonlocal done
            for spec in specs:
                job, _ = await self._store.jobs.create_job(spec)
                if on_created is not None:
                    on_created(job)
                done += 1
                self._progress.update(done, count, f"{done / max(time.monotonic() - started, 1e-6):6,.0f} jobs/s")

        async with asyncio.TaskGroup() as group:
            for index in range(self._parallel):
                group.create_task(feed(), name=f"bench-create-jobs-{index}")
        self._progress.update(done, count, force=True)
        return Created(done, time.monotonic() - started)

    async def calibrate(self) -> float:
        """Seconds per job, measured on throwaway jobs (created far in the future, then deleted)."""
        far = now_utc() + timedelta(days=3650)
        specs = (JobSpec(name=f"calibration-{index}", job_type=JOB_TYPE, tenant="bench-calibration",
                         schedule=Schedule.at_instant(far)) for index in range(CALIBRATION_JOBS))
        created = await self.create(specs, CALIBRATION_JOBS, "measuring the job creation rate")
        page = await self._store.jobs.list_jobs("bench-calibration", limit=CALIBRATION_JOBS)
        for job in page.items:
            await self._store.jobs.delete_job("bench-calibration", job.job_id)
        return created.seconds / max(created.count, 1)

    async def plan_lead_in(self, count: int, launch_lead: timedelta) -> timedelta:
        """How far ahead of now the first run must be due so that creating ``count`` jobs and
        starting the processes ``launch_lead`` before it fit."""
        per_job = await self.calibrate()
        return timedelta(seconds=count * per_job * INSERT_SAFETY) + launch_lead + timedelta(seconds=1)


async def create_phased_interval_jobs(bench: Bench, url: str, jobs: int, every: timedelta) -> tuple[datetime, Created]:
    """Create ``jobs`` interval jobs whose phases spread evenly over one period, then wait until
    it is time to start the processes. Returns the first fire time and what creating took."""
    async with JobWriter(url, bench.progress) as writer:
        first = now_utc() + await writer.plan_lead_in(jobs, bench.launch_lead)
        phase = every / jobs
        specs = (JobSpec(name=f"every-{index}", job_type=JOB_TYPE,
                         schedule=Schedule.interval(every, anchor=first + index * phase)) for index in range(jobs))
        created = await writer.create(specs, jobs, f"creating {jobs:,} interval jobs (every {every.total_seconds():g} s)")
    await sleep_until(first - bench.launch_lead, bench.progress, "waiting to start the processes")
    return first, created


@dataclass(frozen=True, slots=True)
class Offer:
    """A one-shot job a scenario offers: its label (the class the report splits runs by), when it
    falls due (seconds after the first due instant), its tenant and its priority."""

    label: str
    offset_s: float
    tenant: str = DEFAULT_TENANT
    priority: int = 0
    concurrency_key: str | None = None
    concurrency_limit: int | None = None


def even_offsets(rate: float, start_s: float, duration_s: float) -> list[float]:
    """Offsets of runs falling due evenly at ``rate`` a second from ``start_s`` for ``duration_s``."""
    return [start_s + index / rate for index in range(round(rate * duration_s))]


def job_name(label: str, index: int) -> str:
    """A job's name: its label and a number that makes it unique (see :func:`label_of`)."""
    return f"{label}-{index}"


def label_of(name: str) -> str:
    """The label a job was named after by :func:`job_name`."""
    return name.rpartition("-")[0]


async def create_offers(bench: Bench, url: str, offers: Sequence[Offer],
                        job_type: str) -> tuple[datetime, Created, dict[str, str]]:
    """Create a one-shot job per offer (``offers`` in due order), then wait until it is time to
    start the processes. Returns the first due instant, what creating took, and the label of each job
    id: the workers record job ids, so that the runs can be split by label afterwards."""
    labels: dict[str, str] = {}

    def remember(job: Job) -> None:
        labels[job.job_id] = label_of(job.name)

    async with JobWriter(url, bench.progress) as writer:
        first = now_utc() + await writer.plan_lead_in(len(offers), bench.launch_lead)
        specs = (JobSpec(name=job_name(offer.label, index), job_type=job_type, tenant=offer.tenant,
                         priority=offer.priority, schedule=Schedule.at_instant(first + timedelta(seconds=offer.offset_s)),
                         concurrency_key=offer.concurrency_key, concurrency_limit=offer.concurrency_limit)
                 for index, offer in enumerate(offers))
        created = await writer.create(specs, len(offers), f"creating {len(offers):,} one-shot jobs",
                                      on_created=remember)
    await sleep_until(first - bench.launch_lead, bench.progress, "waiting to start the processes")
    return first, created, labels


def split_by_label(records: Iterable[RunRecord], labels: Mapping[str, str]) -> dict[str, Deliveries]:
    """The deliveries of each label, a run's label being its job's; runs of other jobs are left out."""
    grouped: dict[str, list[RunRecord]] = {}
    for record in records:
        label = labels.get(record.job_id)
        if label is not None:
            grouped.setdefault(label, []).append(record)
    return {label: deliveries(group) for label, group in grouped.items()}


def started_between(records: Iterable[RunRecord], start_us: int, end_us: int) -> int:
    """Distinct runs whose handler was entered in ``[start_us, end_us)``: the workers' throughput."""
    return len({record.run_id for record in records if start_us <= record.started_us < end_us})


def note_overrun(bench: Bench, first_due: datetime, ready_at: datetime) -> float:
    """If everything was up only after the first run was due, say so: those runs were late for
    reasons outside what is measured."""
    overrun = (ready_at - first_due).total_seconds()
    if overrun > 0:
        bench.note(f"lead-in overrun: processes were ready {overrun:.1f} s after the first run was due; "
                   "the earliest runs' lag includes start-up")
    return max(overrun, 0.0)


def spread_instants(first: datetime, count: int, over: timedelta) -> list[datetime]:
    """``count`` instants evenly spread from ``first`` over ``over``."""
    step = over / count if count else timedelta(0)
    return [first + index * step for index in range(count)]


def system_result(bench: Bench, system: str, *, jobs: int, got: Deliveries, **figures: object) -> dict[str, object]:
    """The JSON result of one system, with its lag percentiles; keeps the delivery lags for the plot,
    and the start lags too where the handler's start is recorded apart from the receipt.

    ``runs_per_s`` defaults to the runs delivered over the time they took (earliest scheduled
    instant to last receipt); a scenario that measures throughput otherwise passes its own.
    """
    delivery = got.delivery_lags_ms()
    bench.samples[system] = delivery
    start = got.start_lags_ms()
    if any(record.started_us not in (0, record.received_us) for record in got.first):
        bench.samples[f"{system} (start)"] = start  # a peer's start is its receipt: no second curve
    result: dict[str, object] = {
        "system": system,
        "scenario": bench.scenario,
        "backend": bench.backend,
        "jobs": jobs,
        "delivered": got.delivered,
        "duplicates": got.duplicates,
        "start_lag_ms": percentiles(start),
        "delivery_lag_ms": percentiles(delivery),
        "release_lag_ms": percentiles(got.release_lags_ms()),
        "runs_per_s": runs_per_second(got.delivered, delivery_span_s(got.first)),
        **late_starts_waiting_for_cpu(got.first),
    }
    result.update(figures)
    return result
