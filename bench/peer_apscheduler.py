"""The peer under test: APScheduler 3 in a process of its own, firing ``date`` jobs.

    python -m fastlane.bench.peer_apscheduler CONFIG.json

Run by the harness (see :mod:`fastlane.bench.peer`), never by hand. CONFIG says which job store to use
(``memory``, or ``sqlalchemy`` with a database URL), the offsets of the due instants from a base
time, and where to write. The program starts an ``AsyncIOScheduler`` paused, measures how long
adding a job takes, picks the base time so that adding every job fits before it, adds one job
per offset with a ``DateTrigger``, resumes, and waits until every job ran or the grace period
after the last due instant ran out. With a ``realtime_priority`` above 0 it raises its own thread,
which runs the scheduler and the jobs, to ``SCHED_FIFO`` just before resuming, as fastlane's bench
workers run theirs (``fastlane bench --realtime-priority``).

"Delivery" is the moment APScheduler calls the job function (it runs jobs in its own process):
each call appends ``job_id scheduled_us called_us called_us job_id called_us`` to the record file,
the worker record format with the call as release, receipt and start alike: calling the job
function is starting it, so its start lag is its delivery lag.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import orjson
from fastlane.bench.usage import realtime_threads

CALIBRATION_JOBS = 200
LEAD = 2.0  # seconds between the last job added and the first due instant, at the measured rate
SAFETY = 1.3

_record: TextIO | None = None
_calls = 0
_expected = 0
_all_called: asyncio.Event | None = None


async def noop(job_id: str, scheduled_us: int) -> None:
    """The job: note when it was called."""
    global _calls
    called = time.time_ns() // 1000
    assert _record is not None
    _record.write(f"{job_id} {scheduled_us} {called} {called} {job_id} {called}\n")
    _calls += 1
    if _calls >= _expected and _all_called is not None:
        _all_called.set()


async def calibration_noop() -> None:
    """Never called: the calibration jobs are removed before they are due."""


def _schedule_in_realtime(priority: int) -> None:
    """Fire from a SCHED_FIFO thread, like fastlane's bench workers (without their runaway guard:
    this process only fires jobs): only now, once the jobs are added (seconds of work without a
    pause), and for this thread alone."""
    if not priority:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except OSError as error:  # no CAP_SYS_NICE: the summary's thread count shows it
        print(f"real-time priority not applied: {error}", file=sys.stderr)


def _job_store(config: dict[str, Any]) -> Any:
    if config["store"] == "memory":
        from apscheduler.jobstores.memory import MemoryJobStore

        return MemoryJobStore()
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from sqlalchemy import create_engine, event

    engine = create_engine(config["url"])
    if config["url"].startswith("sqlite"):
        # The same durability settings as fastlane's own SQLite store, for a like-for-like run.
        @event.listens_for(engine, "connect")
        def _pragmas(connection: Any, _record: Any) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.close()

    return SQLAlchemyJobStore(engine=engine)


def _vm_hwm() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


async def run(config: dict[str, Any]) -> dict[str, Any]:
    global _record, _expected, _all_called
    from apscheduler.executors.asyncio import AsyncIOExecutor
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.triggers.date import DateTrigger

    offsets: list[float] = config["offsets_s"]
    _expected = len(offsets)
    _all_called = asyncio.Event()
    _record = open(config["record"], "a", buffering=1)  # noqa: SIM115 - process lifetime
    scheduler = AsyncIOScheduler(
        jobstores={"default": _job_store(config)},
        executors={"default": AsyncIOExecutor()},
        # Every job runs however late (no misfire), once, never coalesced: as fastlane does.
        job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 1},
        timezone=UTC,
    )
    scheduler.start(paused=True)
    try:
        far = datetime.now(UTC) + timedelta(days=3650)
        started = time.monotonic()
        for index in range(CALIBRATION_JOBS):
            scheduler.add_job(calibration_noop, DateTrigger(run_date=far), id=f"calibration-{index}")
        per_job = (time.monotonic() - started) / CALIBRATION_JOBS
        scheduler.remove_all_jobs()

        base = datetime.now(UTC) + timedelta(seconds=per_job * len(offsets) * SAFETY + LEAD)
        started = time.monotonic()
        for index, offset in enumerate(offsets):
            due = base + timedelta(seconds=offset)
            job_id = f"j{index}"
            scheduled_us = round(due.timestamp() * 1_000_000)
            scheduler.add_job(noop, DateTrigger(run_date=due), args=(job_id, scheduled_us), id=job_id)
        insert_s = time.monotonic() - started
        overrun = (datetime.now(UTC) - base).total_seconds()
        _schedule_in_realtime(int(config.get("realtime_priority") or 0))
        scheduler.resume()
        last_due = base + timedelta(seconds=max(offsets, default=0.0))
        wait = (last_due - datetime.now(UTC)).total_seconds() + float(config["grace_s"])
        try:
            async with asyncio.timeout(max(wait, 0.0)):
                await _all_called.wait()
        except TimeoutError:
            pass
        return {"base_us": round(base.timestamp() * 1_000_000), "insert_s": insert_s,
                "lead_in_overrun_s": max(overrun, 0.0), "called": _calls, "peak_rss_bytes": _vm_hwm(),
                "cpu_s": round(sum(os.times()[:2]), 2), "realtime_threads": realtime_threads(os.getpid())}
    finally:
        scheduler.shutdown(wait=False)
        _record.close()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fastlane.bench.peer_apscheduler CONFIG.json", file=sys.stderr)
        return 2
    config = orjson.loads(Path(argv[0]).read_bytes())
    try:
        import uvloop
    except ImportError:
        summary = asyncio.run(run(config))
    else:
        summary = uvloop.run(run(config))
    Path(config["summary"]).write_bytes(orjson.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
