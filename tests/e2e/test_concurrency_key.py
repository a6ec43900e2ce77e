"""A concurrency key caps its runs across the cluster, checked from the workers' own records:
real nodes (three on PostgreSQL, one on SQLite) and two real worker processes connected to all."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from e2e_support import HERE, Daemon, WorkerProcess, child_environment, instant, wait_for

from fastlane.client import Client
from fastlane.domain.models import JobSpec, RunState, Schedule
from fastlane.testing.measure import most_at_once

pytestmark = [pytest.mark.e2e]

RUNS = 60
LIMIT = 3
HANDLER_SECONDS = 0.1


def handler_intervals(records: list[Path]) -> dict[str, tuple[datetime, datetime]]:
    """Per run: when its handler started and ended, as the workers wrote them."""
    started, ended = {}, {}
    for record in records:
        for line in record.read_bytes().splitlines() if record.exists() else []:
            entry = orjson.loads(line)
            started[entry["run_id"]] = instant(entry["received_at"])
        events = Path(f"{record}.events")
        for line in events.read_bytes().splitlines() if events.exists() else []:
            entry = orjson.loads(line)
            if entry["event"] == "outcome":
                ended[entry["run_id"]] = instant(entry["at"])
    return {run_id: (started[run_id], ended[run_id]) for run_id in started if run_id in ended}


@pytest.mark.timeout(180)
async def test_a_concurrency_key_never_has_more_runs_active_than_its_limit(db_url, tmp_path, processes):
    count = 3 if db_url.startswith("postgres") else 1  # SQLite: the embedded single node
    nodes = [Daemon(db_url, tmp_path / f"node-{i}.log", node_id=f"node-{i}") for i in range(count)]
    for node in nodes:
        node.start()
        processes.append(node)
    for node in nodes:
        await node.wait_ready()
    records = [tmp_path / f"worker-{index}.jsonl" for index in range(2)]
    for index, record in enumerate(records):
        worker = WorkerProcess("recording_worker:worker", [node.address for node in nodes],
                               tmp_path / f"worker-{index}.log",
                               env=child_environment(HERE, FASTLANE_RECORD_FILE=str(record)))
        worker.start()
        processes.append(worker)

    async with Client(nodes[0].address, timeout=30) as client:
        await wait_for(lambda: _workers_on_every_node(client, count, 2), 30, "both workers on every node")
        due = datetime.now(UTC) + timedelta(seconds=2)
        # Jobs of many shards (so every node owns some of them) share one key.
        specs = [JobSpec(name=f"ledger-{i}", job_type="e2e", schedule=Schedule.at_instant(due),
                         concurrency_key="ledger", concurrency_limit=LIMIT,
                         payload=orjson.dumps({"sleep": HANDLER_SECONDS})) for i in range(RUNS)]
        jobs = [job for job, _ in await asyncio.gather(*(client.create_job(spec) for spec in specs))]
        assert len({job.shard_id for job in jobs}) > 1

        async def all_succeeded() -> bool:
            runs = [run for job in jobs for run in (await client.list_runs(job_id=job.job_id)).items]
            return len(runs) == RUNS and all(run.state is RunState.SUCCEEDED for run in runs)

        await wait_for(all_succeeded, 120, f"all {RUNS} runs to succeed")

    intervals = handler_intervals(records)
    assert len(intervals) == RUNS  # each ran once: none lost, none twice
    # The cap held, and was used: runs of the key ran side by side, never more than the limit.
    as_micros = [(round(start.timestamp() * 1e6), round(end.timestamp() * 1e6)) for start, end in intervals.values()]
    assert most_at_once(as_micros) == LIMIT


async def _workers_on_every_node(client: Client, nodes: int, workers: int) -> bool:
    status = await client.cluster()
    return len(status.nodes) == nodes and all(node.workers_connected >= workers for node in status.nodes)
