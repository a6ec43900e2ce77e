"""``floor``: the runs a second the database alone allows on this machine, a yardstick for fastlane.

Only the database work a run needs, with the raw driver (asyncpg on PostgreSQL, the standard
library's sqlite3 on SQLite) and nothing of fastlane's in between: no node, no worker, no pool, no
store. On a fresh database migrated by the store, with one-shot jobs created through the store as
every scenario creates them (:class:`~fastlane.bench.harness.JobWriter`), it takes the shards'
leases (``ACQUIRE_SHARDS``), reads the due jobs (``LOAD_DUE_JOBS``, timed apart: a recurring job is
read once a window, not once a run) and then, timed end to end, runs every run through the three
writes the node makes of it, in the statements the node runs (imported from the store's dialect
modules, never copied) and the node's transactions:

- **materialise** (the write-ahead's transaction, ``SQLLane.materialise_runs``): ``FENCE``,
  ``ADVANCE_JOBS``, ``ACTIVE_RUNS_OF_JOBS`` for jobs that guard overlap (none here: the default is
  ``allow``), ``INSERT_RUNS``; in batches of :data:`MATERIALISE_BATCH` occurrences, the most the
  node puts in one (``LaneSettings.max_batch``);
- **a journal round** (``SQLAttempts.record_round``), one transaction: the dispatches of the
  runs sent now (PostgreSQL's ``DISPATCH_RUNS``; SQLite's ``DISPATCH_RUNS`` and ``INSERT_ATTEMPTS``),
  then the results of those the round before sent (``SUCCEED_RUNS`` and ``SUCCEED_ATTEMPTS``;
  SQLite: ``CURRENT_ATTEMPTS`` first, and the attempts a row at a time, as its store does), then
  ``RELEASE_BUFFERED`` of the jobs that ended runs;

dispatches and results in batches of at most :data:`JOURNAL_BATCH` runs, the credits of one
bench worker (the most runs it holds at once, so the most one round can send it). As in the node,
the write-ahead and the journal are two tasks on two connections, so on PostgreSQL their
transactions overlap; SQLite has one writer, and the two take turns.

These are the node's largest batches and no time is spent between them: the figure is a ceiling
for what fastlane can reach here, not a rate it should. What is left out: heartbeats (the bench
workers send none for a no-op handler), change notifications (none of these writes makes one),
the node's in-memory work and its gRPC streams.

``--floor`` on ``sustained`` and ``burst`` runs this first, on the same server (a database of its
own in the same PostgreSQL cluster, or an SQLite file beside fastlane's) before any daemon starts,
and reports fastlane's runs/s as a fraction of it (``vs_floor``).
Scaled: ``20,000 x scale`` runs (at least 100).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import orjson
from fastlane.bench.cluster import WORKER_CONCURRENCY
from fastlane.bench.harness import CREATE_WORST_S, JOB_TYPE, SHARDS, START_ALLOWANCE_S, Bench, JobWriter, now_utc
from fastlane.bench.usage import CpuMeter, Metered, postmaster_pid

from fastlane.domain.models import JobSpec, Schedule, new_id
from fastlane.engine.dispatch.lease_tokens import new_lease_token
from fastlane.engine.lane_settings import LANE_DEFAULTS
from fastlane.runtime.clock import to_micros
from fastlane.storage.postgres import queries as postgres_sql
from fastlane.storage.sqlite import queries as sqlite_sql

SYSTEM = "floor"
RUNS = 20_000
MATERIALISE_BATCH = LANE_DEFAULTS.max_batch
JOURNAL_BATCH = WORKER_CONCURRENCY
OWNER = "bench-floor"  # the shards' owner, as a node id would be
WORKER_ID = "bench-floor-worker"
LEASE_TTL = timedelta(hours=1)  # the shard leases: the floor never renews them
WORST_PER_RUN_S = 0.005  # a bound on one run's three writes, for the hard deadline only
JOBS_DUE_FROM = timedelta(days=1)  # the jobs' instants: far enough that no node would fire them


def runs(bench: Bench) -> int:
    return bench.scaled(RUNS, minimum=100)


def budget(bench: Bench) -> float:
    count = runs(bench)
    return START_ALLOWANCE_S + count * (CREATE_WORST_S + WORST_PER_RUN_S) + 60


async def floor(bench: Bench) -> list[dict[str, object]]:
    """``fastlane bench floor``: the floor alone."""
    return [await measure(bench)]


async def floor_first(bench: Bench) -> dict[str, object] | None:
    """The floor, when ``--floor`` asks for it (sustained, burst): measured before the daemon starts."""
    return await measure(bench) if bench.floor else None


def compare_with_floor(result: dict[str, object], floor_result: dict[str, object] | None) -> None:
    """Put fastlane's runs/s beside the floor's: ``floor_runs_per_s`` and ``vs_floor`` (their ratio)."""
    if floor_result is None:
        return
    rate, best = result.get("runs_per_s"), floor_result.get("runs_per_s")
    result["floor_runs_per_s"] = best
    ok = isinstance(rate, int | float) and isinstance(best, int | float) and best > 0
    result["vs_floor"] = round(rate / best, 3) if ok else None  # type: ignore[operator]
    # What the database work alone costs of fastlane's CPU per run (every process of each).
    own, floor_cost = _total_us_per_run(result), _total_us_per_run(floor_result)
    result["floor_cpu_share"] = round(floor_cost / own, 3) if own and floor_cost is not None else None


def _total_us_per_run(result: dict[str, object]) -> float | None:
    cpu = result.get("cpu")
    rows = cpu.get("processes") if isinstance(cpu, dict) else None
    for row in rows if isinstance(rows, list) else ():
        if row.get("role") == "total" and isinstance(row.get("us_per_run"), int | float):
            return float(row["us_per_run"])
    return None


# -- the measurement -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Due:
    job_id: str
    shard_id: int
    fire_at: Any  # as the driver reads it: a datetime from asyncpg, microseconds from SQLite


@dataclass(frozen=True, slots=True)
class Written:
    run_id: str
    job_id: str
    lease_ttl_ms: int


@dataclass(frozen=True, slots=True)
class Sent:
    run_id: str
    job_id: str
    attempt: int
    lease_token: int


@dataclass(frozen=True, slots=True)
class Round:
    """One journal round: what it sent, how many results it recorded, the seconds in each part."""

    sent: list[Sent]
    succeeded: int
    dispatch_s: float
    result_s: float


class Driver(Protocol):
    """One dialect's database work for the floor, on the raw driver."""

    description: str

    async def acquire_shards(self) -> dict[int, int]: ...
    async def load_due(self, limit: int) -> list[Due]: ...
    async def materialise(self, fences: dict[int, int], jobs: Sequence[Due]) -> list[Written]: ...
    async def round(self, runs: Sequence[Written], previous: Sequence[Sent]) -> Round: ...
    async def close(self) -> None: ...


async def measure(bench: Bench) -> dict[str, object]:
    count = runs(bench)
    url = await bench.fresh_database(SYSTEM)
    first = now_utc() + JOBS_DUE_FROM
    async with JobWriter(url, bench.progress) as writer:  # migrates the fresh database
        specs = (JobSpec(name=f"floor-{index}", job_type=JOB_TYPE,
                         schedule=Schedule.at_instant(first + timedelta(milliseconds=index)))
                 for index in range(count))
        created = await writer.create(specs, count, f"floor: creating {count:,} one-shot jobs")
    driver: Driver = await PostgresFloor.connect(url) if bench.pg is not None else SQLiteFloor(url)
    try:
        bench.progress.phase("floor: reading the due jobs")
        fences = await driver.acquire_shards()
        loaded = time.perf_counter()
        due = await driver.load_due(count)
        read_s = time.perf_counter() - loaded
        processes = [Metered("floor driver (harness)", "driver", os.getpid())]
        if bench.pg is not None:
            processes.append(Metered("postgres", "postgres", postmaster_pid(bench.pg.data_dir), tree=True))
        meter = CpuMeter(processes)
        meter.start()
        stages, elapsed, succeeded = await pipeline(driver, fences, due, bench)
        cpu = meter.stop(runs=succeeded)
    finally:
        await driver.close()
    if succeeded < count:
        bench.note(f"floor: {succeeded:,} of {count:,} runs went through all three writes")
    return {
        "system": SYSTEM, "scenario": bench.scenario, "backend": bench.backend, "jobs": count,
        "runs": succeeded, "runs_per_s": round(succeeded / elapsed, 1) if elapsed > 0 else None,
        "driver": driver.description, "materialise_batch": MATERIALISE_BATCH, "journal_batch": JOURNAL_BATCH,
        "floor_elapsed_s": round(elapsed, 3), "due_jobs_read_s": round(read_s, 3),
        **{f"{stage}_s": round(seconds, 3) for stage, seconds in stages.items()},
        "insert_s": round(created.seconds, 2), "cpu": cpu,
    }


async def pipeline(driver: Driver, fences: dict[int, int], due: list[Due],
                   bench: Bench) -> tuple[dict[str, float], float, int]:
    """Every due job's run materialised, dispatched and succeeded: the write-ahead and the journal
    as two tasks, as in the node. Returns the seconds in each stage's transactions, the whole
    time, and the runs succeeded."""
    stages = {"materialise": 0.0, "dispatch": 0.0, "result": 0.0}
    written: deque[Written] = deque()
    more = asyncio.Event()
    writing = True
    succeeded = 0
    bench.progress.phase("floor: materialise, dispatch, result")

    async def write_ahead() -> None:
        nonlocal writing
        try:
            for chunk in _chunks(due, MATERIALISE_BATCH):
                started = time.perf_counter()
                written.extend(await driver.materialise(fences, chunk))
                stages["materialise"] += time.perf_counter() - started
                more.set()
                await asyncio.sleep(0)  # the journal's turn (SQLite's calls never suspend)
        finally:
            writing = False
            more.set()

    async def journal() -> None:
        # Each round dispatches a batch and records the results of the one the round before sent,
        # as a busy node's journal does (a bench worker's no-op handlers end within the round).
        nonlocal succeeded
        previous: Sequence[Sent] = []
        while written or writing or previous:
            if not written and writing:
                more.clear()
                await more.wait()
                continue
            batch = [written.popleft() for _ in range(min(JOURNAL_BATCH, len(written)))]
            done = await driver.round(batch, previous)
            previous = done.sent
            succeeded += done.succeeded
            stages["dispatch"] += done.dispatch_s
            stages["result"] += done.result_s
            bench.progress.update(succeeded, len(due))

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        group.create_task(write_ahead(), name="bench-floor-write-ahead")
        group.create_task(journal(), name="bench-floor-journal")
    elapsed = time.perf_counter() - started
    bench.progress.update(succeeded, len(due), force=True)
    return stages, elapsed, succeeded


def _chunks(items: Sequence[Due], size: int) -> Iterator[Sequence[Due]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _far_future() -> datetime:
    return datetime(9999, 1, 1, tzinfo=UTC)


# -- PostgreSQL: asyncpg ---------------------------------------------------------------------------

PG = postgres_sql.STATEMENTS  # the store's statements as PostgreSQL runs them


class PostgresFloor:
    """Two asyncpg connections, as the node's write-ahead and journal each hold one of its pool."""

    def __init__(self, ahead: Any, journal: Any) -> None:
        self._ahead = ahead
        self._journal = journal
        self.description = f"asyncpg {metadata.version('asyncpg')}"

    @classmethod
    async def connect(cls, dsn: str) -> PostgresFloor:
        import asyncpg

        return cls(await asyncpg.connect(dsn), await asyncpg.connect(dsn))

    async def acquire_shards(self) -> dict[int, int]:
        async with self._ahead.transaction():
            rows = await self._ahead.fetch(PG.ACQUIRE_SHARDS, OWNER, _micros(LEASE_TTL), SHARDS, None)
        return {row["shard_id"]: row["token"] for row in rows}

    async def load_due(self, limit: int) -> list[Due]:
        rows = await self._ahead.fetch(PG.LOAD_DUE_JOBS, list(range(SHARDS)), _far_future(), None, limit, None, "")
        return [Due(row[0], row[1], row[2]) for row in rows]

    async def materialise(self, fences: dict[int, int], jobs: Sequence[Due]) -> list[Written]:
        db = self._ahead
        shard_ids = sorted({job.shard_id for job in jobs})
        async with db.transaction():
            fenced = await db.fetch(PG.FENCE, shard_ids, [OWNER] * len(shard_ids), [fences[s] for s in shard_ids])
            _check_fences(fenced, shard_ids)
            advanced = await db.fetch(PG.ADVANCE_JOBS, [job.job_id for job in jobs], [job.fire_at for job in jobs],
                                      [None] * len(jobs), shard_ids)
            _check_advanced(advanced, jobs)
            if guarded := [row["job_id"] for row in advanced if row["overlap"] != "allow"]:
                await db.fetch(PG.ACTIVE_RUNS_OF_JOBS, guarded)
            rows = await db.fetch(PG.INSERT_RUNS, [new_id() for _ in jobs], [job.job_id for job in jobs],
                                  [job.fire_at for job in jobs], ["scheduled"] * len(jobs), [None] * len(jobs))
        return [Written(row["run_id"], row["job_id"], row["lease_ttl_ms"]) for row in rows]

    async def round(self, runs: Sequence[Written], previous: Sequence[Sent]) -> Round:
        started = time.perf_counter()
        async with self._journal.transaction():
            sent = await self._dispatch(runs) if runs else []
            dispatched = time.perf_counter()
            succeeded = await self._succeed(previous) if previous else 0
        return Round(sent, succeeded, dispatched - started, time.perf_counter() - dispatched)

    async def _dispatch(self, runs: Sequence[Written]) -> list[Sent]:
        now = datetime.now(UTC)
        job_of = {run.run_id: run.job_id for run in runs}
        rows = await self._journal.fetch(
            postgres_sql.DISPATCH_RUNS, list(job_of), [new_lease_token() for _ in runs], [WORKER_ID] * len(runs),
            [OWNER] * len(runs), [run.lease_ttl_ms * 1000 for run in runs], [now] * len(runs))
        return [Sent(row["run_id"], job_of[row["run_id"]], row["attempt"], row["lease_token"]) for row in rows]

    async def _succeed(self, sent: Sequence[Sent]) -> int:
        db = self._journal
        now = datetime.now(UTC)
        rows = await db.fetch(postgres_sql.SUCCEED_RUNS, [s.run_id for s in sent], [s.lease_token for s in sent])
        ended = {row["run_id"] for row in rows}
        done = [s for s in sent if s.run_id in ended]
        await db.fetch(postgres_sql.SUCCEED_ATTEMPTS, [s.run_id for s in done], [s.attempt for s in done],
                       [s.lease_token for s in done], [None] * len(done), [None] * len(done),
                       [now] * len(done), [now] * len(done))
        await db.fetch(PG.RELEASE_BUFFERED, list({row["job_id"] for row in rows}))
        return len(rows)

    async def close(self) -> None:
        for connection in (self._ahead, self._journal):
            with contextlib.suppress(Exception):
                await connection.close()


# -- SQLite: sqlite3 ----------------------------------------------------------------------------------

LITE = sqlite_sql.STATEMENTS  # the store's statements as SQLite runs them


class SQLiteFloor:
    """One sqlite3 connection with the store's pragmas; writes take ``BEGIN IMMEDIATE`` as the store's do."""

    def __init__(self, url: str) -> None:
        self._db = sqlite3.connect(Path(url.removeprefix("sqlite:///")), isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.create_function("fl_now_us", 0, lambda: time.time_ns() // 1000)  # queries.NOW
        for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "busy_timeout = 10000"):
            self._db.execute(f"PRAGMA {pragma}")
        self.description = f"sqlite3 (SQLite {sqlite3.sqlite_version})"

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    async def acquire_shards(self) -> dict[int, int]:
        with self._write() as db:
            rows = db.execute(LITE.ACQUIRE_SHARDS, (OWNER, _micros(LEASE_TTL), SHARDS, None)).fetchall()
        return {row["shard_id"]: row["token"] for row in rows}

    async def load_due(self, limit: int) -> list[Due]:
        rows = self._db.execute(LITE.LOAD_DUE_JOBS, (_json(list(range(SHARDS))), to_micros(_far_future()), None,
                                                     limit, None, "")).fetchall()
        return [Due(row[0], row[1], row[2]) for row in rows]

    async def materialise(self, fences: dict[int, int], jobs: Sequence[Due]) -> list[Written]:
        shard_ids = sorted({job.shard_id for job in jobs})
        with self._write() as db:
            fenced = db.execute(LITE.FENCE, (_json([(s, OWNER, fences[s]) for s in shard_ids]),)).fetchall()
            _check_fences(fenced, shard_ids)
            advanced = db.execute(LITE.ADVANCE_JOBS, (_json([(job.job_id, job.fire_at, None) for job in jobs]),
                                                      _json(shard_ids))).fetchall()
            _check_advanced(advanced, jobs)
            if guarded := [row["job_id"] for row in advanced if row["overlap"] != "allow"]:
                db.execute(LITE.ACTIVE_RUNS_OF_JOBS, (_json(guarded),)).fetchall()
            rows = db.execute(LITE.INSERT_RUNS, (_json([(new_id(), job.job_id, job.fire_at, "scheduled", None)
                                                        for job in jobs]),)).fetchall()
        return [Written(row["run_id"], row["job_id"], row["lease_ttl_ms"]) for row in rows]

    async def round(self, runs: Sequence[Written], previous: Sequence[Sent]) -> Round:
        started = time.perf_counter()
        with self._write() as db:
            sent = self._dispatch(db, runs) if runs else []
            dispatched = time.perf_counter()
            succeeded = self._succeed(db, previous) if previous else 0
        return Round(sent, succeeded, dispatched - started, time.perf_counter() - dispatched)

    @staticmethod
    def _dispatch(db: sqlite3.Connection, runs: Sequence[Written]) -> list[Sent]:
        now = time.time_ns() // 1000
        job_of = {run.run_id: run.job_id for run in runs}
        started = db.execute(sqlite_sql.DISPATCH_RUNS, (_json([
            (run.run_id, new_lease_token(), WORKER_ID, run.lease_ttl_ms * 1000, now) for run in runs]),)).fetchall()
        rows = db.execute(sqlite_sql.INSERT_ATTEMPTS, (_json([
            (row["run_id"], row["attempts"], row["lease_token"], row["worker_id"], OWNER, now)
            for row in started]),)).fetchall()
        return [Sent(row["run_id"], job_of[row["run_id"]], row["attempt"], row["lease_token"]) for row in rows]

    @staticmethod
    def _succeed(db: sqlite3.Connection, sent: Sequence[Sent]) -> int:
        now = time.time_ns() // 1000
        ids = _json([s.run_id for s in sent])
        current = {(row["run_id"], row["lease_token"]) for row in db.execute(sqlite_sql.CURRENT_ATTEMPTS, (ids,)).fetchall()}
        applied = [s for s in sent if (s.run_id, s.lease_token) in current]
        rows = db.execute(sqlite_sql.SUCCEED_RUNS, (_json([s.run_id for s in applied]),)).fetchall()
        db.executemany(sqlite_sql.SUCCEED_ATTEMPTS, [(s.run_id, s.lease_token, None, None, now, now) for s in applied])
        db.execute(LITE.RELEASE_BUFFERED, (_json(list({row["job_id"] for row in rows})),)).fetchall()
        return len(rows)

    async def close(self) -> None:
        self._db.close()


# -- both ----------------------------------------------------------------------------------------------


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


def _check_fences(rows: Sequence[Any], shard_ids: Sequence[int]) -> None:
    if len(rows) != len(shard_ids):
        raise RuntimeError(f"the floor lost {len(shard_ids) - len(rows)} of its shard leases")


def _check_advanced(rows: Sequence[Any], jobs: Sequence[Due]) -> None:
    # The node would read the jobs not advanced (JOBS_BY_IDS); nothing else touches these.
    if len(rows) != len(jobs):
        raise RuntimeError(f"{len(jobs) - len(rows)} of {len(jobs)} due jobs were not advanced")
