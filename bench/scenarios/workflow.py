"""``workflow``: how soon a workflow's step starts once its parents have ended.

1,000 runs of a 10-step DAG (a fan-out to three branches, a join, a second fan-out, a join and a
chain: ``a → b, c, d → e → f, g → h → i → j``) are triggered at a steady pace (50 a second) on
one node, with one worker whose handlers return at once. The worker writes when each step's
handler started and ended (one clock: node, worker and harness share the machine). The figure is,
for every step with parents, its handler's start minus the latest end of its parents' handlers:
what the node adds between a parent's result and the child's start (recording the result,
advancing the workflow run in the database, dispatching the child). Target: p99 ≤ 10 ms.
Scaled: ``1,000 x scale`` workflow runs (at least 20).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fastlane.bench.harness import Bench, Deadline
from fastlane.bench.processes import Daemon, WorkerProcess, child_environment
from fastlane.bench.stats import percentiles

from fastlane.client import Client

RUNS = 1_000
PACE_PER_S = 50
STEPS = {"a": [], "b": ["a"], "c": ["a"], "d": ["a"], "e": ["b", "c", "d"], "f": ["e"], "g": ["e"],
         "h": ["f", "g"], "i": ["h"], "j": ["i"]}
GRACE_S = 60.0
P99_TARGET_MS = 10.0


def budget(bench: Bench) -> float:
    return 60 + bench.scaled(RUNS, minimum=20) / PACE_PER_S * 3 + GRACE_S


def definition() -> dict[str, object]:
    return {"name": "bench-dag", "steps": [
        {"name": name, "job_type": "bench.step", "after": parents} for name, parents in STEPS.items()
    ]}


def handoff_gaps_ms(record: Path) -> list[float]:
    """For each child step run: its start minus the latest end of its parents (same workflow run)."""
    started: dict[tuple[str, str], int] = {}
    ended: dict[tuple[str, str], int] = {}
    for line in record.read_text().splitlines() if record.exists() else []:
        kind, _run_id, workflow_run_id, step, at = line.split()
        (started if kind == "S" else ended).setdefault((workflow_run_id, step), int(at))
    gaps = []
    for (workflow_run_id, step), start in started.items():
        parents = [ended.get((workflow_run_id, parent)) for parent in STEPS[step]]
        if parents and all(end is not None for end in parents):
            gaps.append((start - max(end for end in parents if end is not None)) / 1000)
    return gaps


async def workflow(bench: Bench) -> list[dict[str, object]]:
    runs = bench.scaled(RUNS, minimum=20)
    url = await bench.fresh_database("fastlane")
    record = bench.workdir / "workflow-steps.txt"
    node = Daemon(url, bench.workdir / "node.log", shards=64)
    worker = WorkerProcess("fastlane.bench.workflow_worker:worker", [node.address], bench.workdir / "worker.log",
                           env=child_environment(FASTLANE_BENCH_RECORD=str(record)),
                           extra_args=bench.worker_scheduling_args())
    try:
        node.start()
        await node.wait_ready()
        worker.start()
        async with Client(node.address) as client:
            await client.create_workflow(definition())
            await _wait_for_worker(client)
            bench.progress.phase(f"triggering {runs:,} workflow runs at {PACE_PER_S}/s")
            started = time.monotonic()
            ids = []
            for index in range(runs):
                await asyncio.sleep(max(0.0, started + index / PACE_PER_S - time.monotonic()))
                ids.append((await client.trigger_workflow("bench-dag", {"index": index})).workflow_run_id)
                bench.progress.update(index + 1, runs)
            bench.progress.phase("waiting for every step to end")
            deadline = Deadline(GRACE_S + runs / PACE_PER_S)
            while _ends(record) < runs * len(STEPS) and not deadline.expired:
                bench.progress.update(_ends(record), runs * len(STEPS))
                await asyncio.sleep(0.2)
            elapsed = time.monotonic() - started
            states = [await _state(client, run_id) for run_id in ids[-20:]]
    finally:
        worker.stop()
        node.stop()
    gaps = handoff_gaps_ms(record)
    ended = _ends(record)
    return [{
        "system": "fastlane", "scenario": bench.scenario, "backend": bench.backend, "workflow_runs": runs,
        "steps_per_run": len(STEPS), "step_runs_ended": ended, "step_runs_expected": runs * len(STEPS),
        "duplicates": _duplicates(record), "last_runs_succeeded": states.count("succeeded"),
        "parent_end_to_child_start_ms": percentiles(gaps), "handoffs": len(gaps),
        "step_runs_per_s": round(ended / elapsed, 1) if elapsed else None, "pace_per_s": PACE_PER_S,
    }]


async def _wait_for_worker(client: Client) -> None:
    deadline = Deadline(30.0)
    while not deadline.expired:
        status = await client.cluster()
        if sum(node.workers_connected for node in status.nodes):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the workflow worker did not connect within 30 s")


async def _state(client: Client, workflow_run_id: str) -> str:
    run, _, _ = await client.get_workflow_run(workflow_run_id)
    return run.state.value


def _ends(record: Path) -> int:
    if not record.exists():
        return 0
    return sum(1 for line in record.read_text().splitlines() if line.startswith("E "))


def _duplicates(record: Path) -> int:
    """Steps of one workflow run whose handler started more than once."""
    seen: set[tuple[str, str]] = set()
    twice = 0
    for line in record.read_text().splitlines() if record.exists() else []:
        kind, _run_id, workflow_run_id, step, _at = line.split()
        if kind == "S":
            twice += (workflow_run_id, step) in seen
            seen.add((workflow_run_id, step))
    return twice
