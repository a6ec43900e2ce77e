"""Nothing starts early, whatever a node's or a worker's wall clock does.

Two nodes on one PostgreSQL and a recording worker, real processes. One of them runs with its
wall clock shifted or stepped by libfaketime (``LD_PRELOAD``, its monotonic clock left real with
``FAKETIME_DONT_FAKE_MONOTONIC``; the shift is read from a file, again on every reading, so the
test steps it while runs fire). The worker records the monotonic clock at each handler's entry,
which this process turns into real time; against it:

- a node whose clock is off by more than the bound owns no shards, and the other fires its runs;
- a node 0.3 s ahead (inside the bound) fires on the database's time, not its own;
- a node whose clock steps ahead and back while runs fire takes each step back at once;
- a worker 2 s behind starts held runs on time, and history shows the real start lags.

Each: no run started more than 5 ms before its instant, none twice, none lost.
"""

from __future__ import annotations

import asyncio
import glob
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from e2e_support import Daemon, Process, Recorder, child_environment, instant, wait_for, workers_connected

from fastlane.client import Client
from fastlane.domain.models import RunState, Schedule

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SHARDS = 8
STEP_HELD = 1.2  # seconds each step of the stepped clock holds
EARLY = timedelta(milliseconds=5)  # how early a start may seem: the worker's estimate of a node's clock
HERE = Path(__file__).resolve().parent
LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))


def faked(shift_file: Path, shift: str) -> dict[str, str]:
    """The environment of a process whose wall clock is shifted by what ``shift_file`` says."""
    assert LIBFAKETIME, "libfaketime is missing: `make tools` installs Debian's faketime"
    shift_file.write_text(shift)
    return child_environment(HERE, LD_PRELOAD=LIBFAKETIME[0], FAKETIME_TIMESTAMP_FILE=str(shift_file),
                             FAKETIME_NO_CACHE="1", FAKETIME_DONT_FAKE_MONOTONIC="1")


class Cluster:
    def __init__(self, nodes: list[Daemon], worker: Recorder, client: Client) -> None:
        self.nodes, self.worker, self.client = nodes, worker, client


async def start_cluster(pg_dsn: str, tmp_path: Path, processes: list[Process], *, node_env: dict[str, str] | None,
                        worker_env: dict[str, str] | None) -> Cluster:
    """Node 1 on the real clock, node 2 with ``node_env``, a recording worker with ``worker_env``."""
    nodes = []
    for name, env in (("node-1", None), ("node-2", node_env)):
        node = Daemon(pg_dsn, tmp_path / f"{name}.log", node_id=name, shards=SHARDS, env=env)
        node.start()
        processes.append(node)
        nodes.append(node)
    for node in nodes:
        await node.wait_ready()
    record = tmp_path / "received.jsonl"
    env = dict(worker_env or child_environment(HERE))
    env["FASTLANE_RECORD_FILE"] = str(record)
    worker = Recorder(nodes[0].address, record, tmp_path / "worker.log")
    worker.env = env
    worker.start()
    processes.append(worker)
    client = Client(nodes[0].address)

    async def connected() -> bool:
        return await workers_connected(client) == len(nodes)

    await wait_for(connected, 30, "the worker to connect to both nodes")
    return Cluster(nodes, worker, client)


def real_time_of(monotonic_ns: int) -> datetime:
    """The real wall-clock time of a reading of the (system-wide) monotonic clock."""
    wall, monotonic = time.time_ns(), time.monotonic_ns()
    return datetime.fromtimestamp((monotonic_ns + wall - monotonic) / 1e9, UTC)


async def fire_and_judge(cluster: Cluster, *, count: int, every: timedelta, while_firing=None) -> list[dict]:  # type: ignore[no-untyped-def]
    """Schedule ``count`` one-shot runs ``every`` apart from two seconds on, wait for them all,
    and check that none started early, twice, or not at all; returns the worker's records."""
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    jobs = {}
    for i in range(count):
        job = await cluster.client.create(f"clock-{i}", "e2e", Schedule.at_instant(first + every * i))
        jobs[job.job_id] = first + every * i
    if while_firing is not None:
        await while_firing(first, first + every * count)
    await wait_for(lambda: {entry["job_id"] for entry in cluster.worker.received()} >= set(jobs),
                   30 + (every * count).total_seconds(), "every run to start")
    records = [entry for entry in cluster.worker.received() if entry["job_id"] in jobs]
    started_twice = [run for run, n in Counter(entry["run_id"] for entry in records).items() if n > 1]
    assert started_twice == []
    early = [(entry["job_id"], (real_time_of(entry["received_monotonic_ns"]) - jobs[entry["job_id"]]))
             for entry in records if real_time_of(entry["received_monotonic_ns"]) < jobs[entry["job_id"]] - EARLY]
    assert early == [], f"{len(early)} of {len(records)} runs started early: {early[:5]}"
    assert {entry["job_id"] for entry in records} == set(jobs)  # none lost
    earliest = min(real_time_of(entry["received_monotonic_ns"]) - jobs[entry["job_id"]] for entry in records)
    print(f"{len(records)} runs, earliest start {earliest.total_seconds() * 1000:+.2f} ms from its instant, "
          "0 twice, 0 lost")  # the figures the closing notes quote (pytest -s)
    return records


async def history_agrees(cluster: Cluster, records: list[dict]) -> None:
    """Each attempt's recorded start, as history shows it, is the real one to within 5 ms."""
    async def settled(run_id: str):  # type: ignore[no-untyped-def]
        run, attempts = await cluster.client.get_run(run_id)
        return attempts if run.state is RunState.SUCCEEDED and attempts[0].started_at else None

    worst = timedelta(0)
    for entry in records[:10]:
        [attempt] = await wait_for(lambda run_id=entry["run_id"]: settled(run_id), 20, f"run {entry['run_id']} to succeed")
        real = real_time_of(entry["received_monotonic_ns"])
        assert abs(attempt.started_at - real) <= EARLY, (attempt.started_at, real, instant(entry["received_at"]))
        worst = max(worst, abs(attempt.started_at - real))
    print(f"history's start times within {worst.total_seconds() * 1000:.2f} ms of the real ones")


async def test_a_node_far_off_owns_no_shards_and_the_other_fires_every_run(pg_dsn, tmp_path, processes) -> None:
    cluster = await start_cluster(pg_dsn, tmp_path, processes, node_env=faked(tmp_path / "shift", "+5"),
                                  worker_env=None)
    try:
        status = await cluster.client.cluster()
        [far] = [node for node in status.nodes if node.node_id == "node-2"]
        assert far.shards_owned == 0 and "exceeds the bound" in far.note
        await fire_and_judge(cluster, count=20, every=timedelta(milliseconds=100))
    finally:
        await cluster.client.close()


async def test_a_node_ahead_inside_the_bound_fires_on_the_databases_time(pg_dsn, tmp_path, processes) -> None:
    cluster = await start_cluster(pg_dsn, tmp_path, processes, node_env=faked(tmp_path / "shift", "+0.3"),
                                  worker_env=None)
    try:
        status = await cluster.client.cluster()
        assert all(node.shards_owned > 0 for node in status.nodes)  # the shifted node fires too
        measured = cluster.nodes[1].metrics()["fastlane_clock_offset_seconds"]
        assert -0.35 < measured < -0.25, measured  # the shift is in force: the database is 0.3 s behind it
        records = await fire_and_judge(cluster, count=40, every=timedelta(milliseconds=50))
        await history_agrees(cluster, records)
    finally:
        await cluster.client.close()


async def test_a_node_whose_clock_steps_while_runs_fire_starts_none_early(pg_dsn, tmp_path, processes) -> None:
    shift = tmp_path / "shift"
    cluster = await start_cluster(pg_dsn, tmp_path, processes, node_env=faked(shift, "+0"), worker_env=None)
    shifted = cluster.nodes[1]

    async def step_the_clock(start: datetime, end: datetime) -> None:
        await asyncio.sleep(max((start - datetime.now(UTC)).total_seconds(), 0.0))
        for step in ("+3", "+0", "-3", "+0"):
            shift.write_text(step)
            await asyncio.sleep(STEP_HELD)  # the fault plan: each shift holds while runs fire

    try:
        await fire_and_judge(cluster, count=60, every=timedelta(milliseconds=100), while_firing=step_the_clock)
        assert shifted.metrics()["fastlane_clock_steps_total"] >= 4
    finally:
        await cluster.client.close()


async def test_a_worker_behind_starts_runs_on_time_and_history_shows_real_lags(pg_dsn, tmp_path, processes) -> None:
    cluster = await start_cluster(pg_dsn, tmp_path, processes, node_env=None,
                                  worker_env=faked(tmp_path / "shift", "-2"))
    try:
        records = await fire_and_judge(cluster, count=30, every=timedelta(milliseconds=100))
        behind = [real_time_of(entry["received_monotonic_ns"]) - instant(entry["received_at"]) for entry in records]
        assert all(timedelta(seconds=1.9) < lag < timedelta(seconds=2.1) for lag in behind)  # the shift is in force
        await history_agrees(cluster, records)
    finally:
        await cluster.client.close()
