"""Workflows end to end: a real daemon, a real worker process, on both backends.

Every check reads the worker's own records (what each handler received, and when it ended), so a
step run twice or started before its parents ended shows there, whatever the node believes.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest
from e2e_support import (
    HERE,
    Daemon,
    Process,
    WorkerProcess,
    child_environment,
    instant,
    read_records,
    run_cli,
    wait_for,
)

from fastlane.client import Client
from fastlane.domain.workflows import StepState, WorkflowRunState

pytestmark = pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)

FAST_RETRY = {"max_attempts": 3, "backoff_base_seconds": 0.05, "backoff_cap_seconds": 0.1}


class StepWorker(WorkerProcess):
    def __init__(self, address: str, tmp_path: Path, name: str = "steps") -> None:
        self.record_path = tmp_path / f"{name}.jsonl"
        env = child_environment(HERE, FASTLANE_RECORD_FILE=str(self.record_path))
        super().__init__("workflow_worker:worker", [address], tmp_path / f"{name}.log", env=env)

    def received(self) -> list[dict]:
        return read_records(self.record_path)

    def ended(self) -> list[dict]:
        return read_records(Path(f"{self.record_path}.events"))




def step(name: str, *after: str | dict, **fields: object) -> dict:
    return {"name": name, "job_type": "wf.step", "after": list(after), **fields}


@pytest.fixture
async def steps(daemon: Daemon, tmp_path: Path, processes: list[Process]) -> StepWorker:
    worker = StepWorker(daemon.address, tmp_path)
    worker.start()
    processes.append(worker)
    return worker


async def finished(client: Client, workflow_run_id: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    async def ended():  # type: ignore[no-untyped-def]
        run, _, steps = await client.get_workflow_run(workflow_run_id)
        return (run, steps) if run.state is not WorkflowRunState.RUNNING else None

    return await wait_for(ended, timeout, f"workflow run {workflow_run_id} to end", interval=0.1)


async def test_a_diamond_with_a_failing_and_retried_step_runs_each_step_once_per_success(
    client: Client, steps: StepWorker
) -> None:
    await client.create_workflow({"name": "diamond", "steps": [
        step("a"),
        step("b", "a", params={"fail_until_attempt": 2}, retry=FAST_RETRY),
        step("c", "a"),
        step("d", "b", "c"),
    ]})
    started = await client.trigger_workflow("diamond", {"order": 7})
    run, views = await finished(client, started.workflow_run_id)

    assert run.state is WorkflowRunState.SUCCEEDED, run.error
    assert {view.name: view.state for view in views} == dict.fromkeys("abcd", StepState.SUCCEEDED)
    received = steps.received()
    assert Counter(entry["step"] for entry in received) == {"a": 1, "b": 2, "c": 1, "d": 1}
    assert sorted(entry["attempt"] for entry in received if entry["step"] == "b") == [1, 2]
    assert {entry["workflow_run_id"] for entry in received} == {started.workflow_run_id}
    assert all(entry["input"] == {"order": 7} for entry in received)
    d = next(entry for entry in received if entry["step"] == "d")
    assert d["parents"] == {"b": {"step": "b", "item": None}, "c": {"step": "c", "item": None}}
    # D started only after B's retry and C had ended, as the worker saw it.
    ends = {entry["step"]: instant(entry["at"]) for entry in steps.ended() if entry["result"] == "succeeded"}
    assert instant(d["started_at"]) >= max(ends["b"], ends["c"])


async def test_a_fan_out_of_a_hundred_items_runs_each_once_and_fans_in_their_outputs(
    client: Client, steps: StepWorker
) -> None:
    await client.create_workflow({"name": "fan", "steps": [
        step("list", params={"output": {"items": list(range(100))}}),
        step("each", "list", for_each="list.items"),
        step("total", "each"),
    ]})
    started = await client.trigger_workflow("fan")
    run, views = await finished(client, started.workflow_run_id)

    assert run.state is WorkflowRunState.SUCCEEDED, run.error
    each = next(view for view in views if view.name == "each")
    assert each.items == 100
    received = steps.received()
    items = [entry["item"] for entry in received if entry["step"] == "each"]
    assert sorted(items) == list(range(100))  # each item once, none twice
    total = [entry for entry in received if entry["step"] == "total"]
    assert len(total) == 1
    assert total[0]["parents"]["each"] == [{"step": "each", "item": i} for i in range(100)]


async def test_fail_fast_cancels_what_is_pending_and_resume_runs_only_the_failed_step_again(
    client: Client, steps: StepWorker
) -> None:
    await client.create_workflow({"name": "ledger", "failure_policy": "fail_fast", "steps": [
        step("debit"),
        step("credit", "debit", params={"fail_until_attempt": 2}, retry={"max_attempts": 1}),
        step("notify", "credit"),
        step("refund", {"step": "credit", "on": "on_failure"}),
    ]})
    started = await client.trigger_workflow("ledger")
    run, views = await finished(client, started.workflow_run_id)
    states = {view.name: view.state for view in views}
    # The failure is handled by refund's on_failure edge: the run goes on and succeeds.
    assert run.state is WorkflowRunState.SUCCEEDED, run.error
    assert states == {"debit": StepState.SUCCEEDED, "credit": StepState.FAILED, "notify": StepState.SKIPPED,
                      "refund": StepState.SUCCEEDED}

    await client.create_workflow({"name": "strict", "failure_policy": "fail_fast", "steps": [
        step("debit"),
        step("credit", "debit", params={"fail_until_attempt": 2}, retry={"max_attempts": 1}),
        step("slow", "debit", params={"sleep": 3}),
        step("notify", "credit"),
    ]})
    started = await client.trigger_workflow("strict")
    run, views = await finished(client, started.workflow_run_id)
    states = {view.name: view.state for view in views}
    assert run.state is WorkflowRunState.FAILED and "credit" in (run.error or "")
    assert states["notify"] is StepState.CANCELLED  # never made
    assert states["slow"] in (StepState.ACTIVE, StepState.CANCELLED)  # its worker was told to stop

    resumed = await client.resume_workflow_run(started.workflow_run_id)
    assert resumed.state is WorkflowRunState.RUNNING
    run, views = await finished(client, started.workflow_run_id)
    assert run.state is WorkflowRunState.SUCCEEDED, run.error
    received = [entry for entry in steps.received() if entry["workflow_run_id"] == started.workflow_run_id]
    counted = Counter(entry["step"] for entry in received)
    assert counted["debit"] == 1  # succeeded before: not run again
    assert counted["credit"] == 2 and counted["notify"] == 1


async def test_cancelling_a_workflow_run_stops_its_running_step_and_makes_no_more(
    client: Client, steps: StepWorker
) -> None:
    await client.create_workflow({"name": "long", "steps": [step("slow", params={"sleep": 60}), step("after", "slow")]})
    started = await client.trigger_workflow("long")
    await wait_for(lambda: any(e["step"] == "slow" for e in steps.received()), 30, "the slow step to start")
    cancelled = await client.cancel_workflow_run(started.workflow_run_id)
    assert cancelled.state is WorkflowRunState.CANCELLED

    async def slow_stopped():  # type: ignore[no-untyped-def]
        _, _, views = await client.get_workflow_run(started.workflow_run_id)
        return next(view for view in views if view.name == "slow").state is StepState.CANCELLED

    await wait_for(slow_stopped, 30, "the running step to end cancelled")
    _, _, views = await client.get_workflow_run(started.workflow_run_id)
    assert next(view for view in views if view.name == "after").state is StepState.CANCELLED
    assert not any(entry["step"] == "after" for entry in steps.received())


async def test_a_node_killed_mid_workflow_leaves_nothing_lost_and_nothing_run_twice(
    db_url: str, tmp_path: Path, processes: list[Process]
) -> None:
    first = Daemon(db_url, tmp_path / "first.log", node_id="node-1")
    first.start()
    processes.append(first)
    await first.wait_ready()
    worker = StepWorker(first.address, tmp_path)
    worker.start()
    processes.append(worker)
    async with Client(first.address) as client:
        await client.create_workflow({"name": "chain", "steps": [
            step("one"), step("two", "one", params={"sleep": 1.5}, lease_ttl_seconds=3), step("three", "two"),
            step("fan", "three", for_each="input.items"), step("last", "fan"),
        ]})
        started = await client.trigger_workflow("chain", {"items": list(range(20))})
        await wait_for(lambda: any(e["step"] == "two" for e in worker.received()), 30, "step two to start")
    first.kill()  # SIGKILL while step two runs: its result has nowhere to go until a node is back

    second = Daemon(db_url, tmp_path / "second.log", node_id="node-2")
    second.start()
    processes.append(second)
    await second.wait_ready()
    restarted = StepWorker(second.address, tmp_path, name="steps-2")  # the first worker's node is gone
    restarted.start()
    processes.append(restarted)
    async with Client(second.address) as client:
        run, views = await finished(client, started.workflow_run_id, timeout=120)
    assert run.state is WorkflowRunState.SUCCEEDED, run.error
    assert all(view.state is StepState.SUCCEEDED for view in views)
    received = worker.received() + restarted.received()
    runs_of: dict[tuple[str, int | None], set[str]] = {}
    for entry in received:
        runs_of.setdefault((entry["step"], entry["item"]), set()).add(entry["run_id"])
    # Every step of the success path was made, each exactly once (one run per step and item)...
    assert set(runs_of) == {("one", None), ("two", None), ("three", None), ("last", None),
                            *(("fan", i) for i in range(20))}
    assert all(len(run_ids) == 1 for run_ids in runs_of.values())
    # ...and ran once, but for "two": its result died with the node, so its lease ran out and it
    # was delivered again (at least once), as a second attempt of the same run.
    attempts = Counter((entry["step"], entry["item"]) for entry in received)
    assert all(count == 1 for key, count in attempts.items() if key != ("two", None))


async def test_the_cli_creates_triggers_lists_and_draws_a_workflow_run(
    daemon: Daemon, client: Client, steps: StepWorker, tmp_path: Path
) -> None:
    definition = tmp_path / "pipeline.json"
    definition.write_bytes(orjson.dumps({"name": "pipeline", "steps": [
        step("extract"), step("load", "extract"), step("alert", {"step": "load", "on": "on_failure"}),
    ]}))
    created = run_cli(daemon, "workflows", "create", str(definition))
    assert isinstance(created, dict) and created["version"] == 1 and created["created"] is True
    again = run_cli(daemon, "workflows", "create", str(definition))
    assert isinstance(again, dict) and again["created"] is False  # the same definition: no new version
    started = run_cli(daemon, "workflows", "trigger", "pipeline", "--input", '{"day": "2026-11-24"}')
    assert isinstance(started, dict) and started["input"] == {"day": "2026-11-24"}
    await finished(client, started["workflow_run_id"])

    listed = run_cli(daemon, "workflows", "runs", "pipeline")
    assert isinstance(listed, list) and [r["workflow_run_id"] for r in listed] == [started["workflow_run_id"]]
    shown = run_cli(daemon, "workflows", "show", started["workflow_run_id"][:8])  # a unique start, as runs get takes
    assert isinstance(shown, dict) and shown["workflow_run_id"] == started["workflow_run_id"]
    assert {s["name"]: s["state"] for s in shown["steps"]} == {"extract": "succeeded", "load": "succeeded",
                                                               "alert": "skipped"}
    drawn = subprocess.run(
        [sys.executable, "-m", "fastlane", "workflows", "show", started["workflow_run_id"], "--dot",
         "--server", daemon.address], capture_output=True, env=child_environment(), timeout=60, check=True,
    ).stdout.decode()
    assert drawn.startswith('digraph "pipeline" {')
    assert '"extract" -> "load";' in drawn and '"load" -> "alert" [label="on_failure"];' in drawn
    assert 'fillcolor=lightgrey' in drawn  # alert, skipped
