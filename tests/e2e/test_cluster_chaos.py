"""A cluster under failure: PostgreSQL, nodes killed, paused, added and stopped, while 3,000
one-shot jobs fall due over 24 s. Afterwards every occurrence must have exactly one run, every run
must have reached a worker and succeeded, and nothing may be missing.

Run alone with ``make chaos`` (or ``pytest -m chaos``). The failover gaps it measures are printed
and, when FASTLANE_CHAOS_REPORT names a file, written there as JSON.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from e2e_support import HERE, read_records, wait_for

from fastlane.client import Client
from fastlane.domain.models import JobSpec, RunState, Schedule
from fastlane.storage import open_store
from fastlane.testing.processes import Daemon, WorkerProcess, child_environment, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.postgres]

JOBS = 3_000
SPREAD = timedelta(seconds=24)
LEAD_IN = timedelta(seconds=18)  # time to create the jobs (through the API: quotas and audit included) before the first is due
LEASE_TTL = 3.0
SHARDS = 32


class Node(Daemon):
    def __init__(self, dsn: str, workdir: Path, name: str, port: int) -> None:
        super().__init__(dsn, workdir / f"{name}.log", node_id=name, shards=SHARDS,
                         extra_args=["--shard-lease-ttl", str(LEASE_TTL)])
        self.node_id = name
        # A fixed port: a node restarted after a crash comes back at the same address.
        self.port = port
        self.address = f"127.0.0.1:{port}"
        listen = self.argv.index("--listen") + 1
        self.argv[listen] = self.address




async def shards_of(dsn: str, node_id: str) -> set[int]:
    store = open_store(dsn)
    try:
        return {shard.shard_id for shard in await store.shards.list_shards() if shard.owner == node_id}
    finally:
        await store.close()


async def test_a_cluster_under_failure_fires_every_occurrence_exactly_once(pg_dsn, tmp_path, processes):
    ports = [free_port() for _ in range(4)]
    nodes = [Node(pg_dsn, tmp_path, f"node-{index + 1}", port) for index, port in enumerate(ports)]
    for node in nodes[:3]:
        node.start()
        processes.append(node)
    for node in nodes[:3]:
        await node.wait_ready()
    addresses = [node.address for node in nodes]  # node-4 joins later; workers retry until it is up
    records = [tmp_path / f"worker-{index}.jsonl" for index in range(2)]
    for index, record in enumerate(records):
        worker = WorkerProcess("recording_worker:worker", addresses, tmp_path / f"worker-{index}.log",
                               env=child_environment(HERE, FASTLANE_RECORD_FILE=str(record)))
        worker.start()
        processes.append(worker)

    first_due = datetime.now(UTC) + LEAD_IN
    step = SPREAD / JOBS
    async with Client(nodes[0].address, timeout=30) as client:
        specs = [JobSpec(name=f"chaos-{i}", job_type="e2e", schedule=Schedule.at_instant(first_due + i * step))
                 for i in range(JOBS)]
        for start in range(0, JOBS, 200):
            await asyncio.gather(*(client.create_job(spec) for spec in specs[start:start + 200]))
    assert datetime.now(UTC) < first_due, "creating the jobs took longer than the lead-in"

    async def at(offset: float) -> None:
        delay = (first_due + timedelta(seconds=offset) - datetime.now(UTC)).total_seconds()
        if delay > 0:
            await asyncio.sleep(delay)  # the chaos timeline itself: these are the moments to strike

    killed, stopped, terminated, joined = nodes[0], nodes[1], nodes[2], nodes[3]
    # The failures are spaced so that each failover gap is measured on its own.
    await at(2)
    killed_shards = await shards_of(pg_dsn, killed.node_id)
    killed_at = datetime.now(UTC)
    killed.kill()
    await at(8)
    killed.start()  # same id, same address
    await at(11)
    stopped.popen.send_signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    await at(13)
    joined.start()
    processes.append(joined)
    await asyncio.sleep(max(0.0, paused_at + LEASE_TTL + 2 - time.monotonic()))  # paused longer than its lease
    stopped.popen.send_signal(signal.SIGCONT)
    await at(19)
    terminated_shards = await shards_of(pg_dsn, terminated.node_id)
    terminated_at = datetime.now(UTC)
    assert terminated.stop() == 0, terminated.log_tail()

    # Every job's one run reaches a worker and succeeds.
    store = open_store(pg_dsn)
    try:
        async def all_succeeded() -> bool:
            return await count_runs(store, RunState.SUCCEEDED) == JOBS

        await wait_for(all_succeeded, (SPREAD + timedelta(seconds=60)).total_seconds(),
                       "every run to succeed", interval=1.0)
        runs = await all_runs(store)
    finally:
        await store.close()

    per_job = Counter(run.job_id for run in runs)
    assert len(per_job) == JOBS, "an occurrence has no run"
    assert max(per_job.values()) == 1, "an occurrence has two runs"
    deliveries = [entry for record in records for entry in read_records(record)]
    assert {entry["run_id"] for entry in deliveries} == {run.run_id for run in runs}

    # The paused node noticed it had lost its shards and fired nothing for them after.
    metrics = stopped.metrics()
    lost = sum(value for name, value in metrics.items() if name.startswith("fastlane_shards_lost_total{"))
    assert lost >= 1 and "fastlane_fence_rejections_total" in metrics

    shard_of_run = {run.run_id: run.shard_id for run in runs}
    first_received: dict[str, datetime] = {}
    for entry in deliveries:
        at_worker = datetime.fromisoformat(entry["received_at"])
        first_received[entry["run_id"]] = min(first_received.get(entry["run_id"], at_worker), at_worker)

    def worst_lateness(shards: set[int], since: datetime) -> float:
        """The latest delivery of an occurrence of these shards due in the 5 s after ``since``."""
        late = [
            (first_received[run.run_id] - run.scheduled_for).total_seconds()
            for run in runs
            if shard_of_run[run.run_id] in shards and since <= run.scheduled_for <= since + timedelta(seconds=5)
        ]
        return max(late, default=0.0)

    report = {
        "jobs": JOBS,
        "deliveries": len(deliveries),
        "redeliveries": len(deliveries) - len({entry["run_id"] for entry in deliveries}),
        "lease_ttl_s": LEASE_TTL,
        "killed_node_worst_lateness_s": round(worst_lateness(killed_shards, killed_at), 3),
        "terminated_node_worst_lateness_s": round(worst_lateness(terminated_shards, terminated_at), 3),
        "paused_node_shards_lost": lost,
        "paused_node_fence_rejections": metrics["fastlane_fence_rejections_total"],
    }
    print("chaos report:", orjson.dumps(report).decode())
    if os.environ.get("FASTLANE_CHAOS_REPORT"):
        Path(os.environ["FASTLANE_CHAOS_REPORT"]).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


async def count_runs(store, state: RunState) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for run in await all_runs(store) if run.state is state)


async def all_runs(store):  # type: ignore[no-untyped-def]
    runs, token = [], ""
    while True:
        page = await store.runs.list_runs("default", limit=1000, page_token=token)
        runs.extend(page.items)
        token = page.next_page_token
        if not token:
            return runs
