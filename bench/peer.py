"""Running the peer (APScheduler 3, :mod:`fastlane.bench.peer_apscheduler`) from the harness.

The peer runs in a subprocess of its own so it never shares an event loop (or a core's worth
of harness work) with anything else; it writes one line per call, in the worker record format.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import urllib.parse

import orjson
from fastlane.bench.harness import Bench, Deadline, RecordTail, system_result
from fastlane.bench.processes import Process, child_environment
from fastlane.bench.stats import Deliveries
from fastlane.bench.usage import ProcessMemory

# The peer's systems, by the name results carry, and the APScheduler job store each uses.
PEERS: dict[str, str] = {"apscheduler-memory": "memory", "apscheduler-sqlalchemy": "sqlalchemy"}
STARTUP_ALLOWANCE_S = 60.0
ADD_JOB_WORST_S = 0.02  # a bound on adding one job to a store, for the hard deadline only
MISSING = "APScheduler 3 is not installed (pip install 'apscheduler<4' SQLAlchemy psycopg2-binary): peer not run"


def peer_available(bench: Bench) -> bool:
    """Whether the peer runs: asked for and its packages importable; notes why not once."""
    if not bench.peer:
        bench.note("peer not run (--no-peer)")
        return False
    needed = ["apscheduler", "sqlalchemy"] + (["psycopg2"] if bench.pg is not None else [])
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        bench.note(f"{MISSING} (missing: {', '.join(missing)})")
        return False
    return True


async def _sqlalchemy_url(bench: Bench) -> str:
    url = await bench.fresh_database("apscheduler")
    if url.startswith("sqlite"):
        return url
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(scheme="postgresql+psycopg2"))


async def run_peer(bench: Bench, system: str, offsets_s: list[float], *, grace_s: float,
                   **figures: object) -> tuple[dict[str, object], Deliveries, int]:
    """Run the peer with one ``date`` job per offset; returns its result, what it called, and
    the base instant (µs) the offsets were added to."""
    store = PEERS[system]
    record = bench.workdir / f"{system}-calls.txt"
    summary_path = bench.workdir / f"{system}-summary.json"
    config = {
        "store": store,
        "url": await _sqlalchemy_url(bench) if store == "sqlalchemy" else None,
        "offsets_s": offsets_s,
        "record": str(record),
        "summary": str(summary_path),
        "grace_s": grace_s,
        "realtime_priority": bench.realtime_priority,
    }
    config_path = bench.workdir / f"{system}-config.json"
    config_path.write_bytes(orjson.dumps(config))
    process = Process([sys.executable, "-m", "fastlane.bench.peer_apscheduler", str(config_path)],
                      bench.workdir / f"{system}.log", child_environment())
    jobs = len(offsets_s)
    limit = STARTUP_ALLOWANCE_S + jobs * ADD_JOB_WORST_S + max(offsets_s, default=0.0) + grace_s
    deadline = Deadline(limit)
    tail = RecordTail([record])
    bench.progress.phase(f"{system}: adding jobs, then running")
    process.start()
    try:
        while process.popen is not None and process.popen.poll() is None and not deadline.expired:
            bench.progress.update(tail.read(), jobs, f"{deadline.remaining:5.0f} s left")
            await asyncio.sleep(0.2)
        bench.progress.update(tail.read(), jobs, force=True)
        if deadline.expired:
            bench.note(f"{system} did not finish within {limit:.0f} s and was stopped")
    finally:
        process.stop()
        bench.progress.end()
    summary = orjson.loads(summary_path.read_bytes()) if summary_path.exists() else {}
    bench.memory.append(ProcessMemory(f"{system}", process.pid, summary.get("peak_rss_bytes"), summary.get("cpu_s"),
                                      summary.get("realtime_threads")))
    if process.popen is not None and process.popen.returncode not in (0, None) and not summary:
        bench.note(f"{system} failed (exit {process.popen.returncode}): {process.log_tail(5)}")
    overrun = summary.get("lead_in_overrun_s") or 0.0
    if overrun > 0:
        bench.note(f"{system}: adding the jobs overran the lead-in by {overrun:.1f} s; its earliest lags include that")
    got = tail.deliveries()
    result = system_result(bench, system, jobs=jobs, got=got, store=store, insert_s=summary.get("insert_s"),
                           **figures)
    return result, got, int(summary.get("base_us") or 0)
