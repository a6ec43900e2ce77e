"""Workflows in the Store contract, on SQLite and PostgreSQL: versions, step runs made exactly
once however often and by however many stores a workflow run is advanced, outputs handed on,
cancel and resume."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from fastlane.domain.errors import InvalidState
from fastlane.domain.models import AttemptOutcome, RunState
from fastlane.domain.records import AttemptResult, Dispatch
from fastlane.domain.workflow_definitions import parse_definition
from fastlane.domain.workflows import WorkflowRunState
from fastlane.storage import Change
from fastlane.storage.base import Store

SHARDS = 4
DIAMOND = {"name": "diamond", "steps": [
    {"name": "a", "job_type": "t"}, {"name": "b", "job_type": "t", "after": ["a"]},
    {"name": "c", "job_type": "t", "after": ["a"]}, {"name": "d", "job_type": "t", "after": ["b", "c"]},
]}


@pytest.fixture
async def store(make_store):
    store = make_store(shard_count=SHARDS)
    await store.migrate()
    yield store
    await store.close()


async def finish(store: Store, run_id: str, token: int, outcome: AttemptOutcome, output: object = None) -> None:
    await store.attempts.record_dispatches([Dispatch(run_id=run_id, lease_token=token, worker_id="w", node_id="n",
                                            lease_ttl=timedelta(seconds=30), dispatched_at=datetime.now(UTC))])
    await store.attempts.record_results([AttemptResult(run_id=run_id, lease_token=token, outcome=outcome,
                                              output=b"" if output is None else orjson.dumps(output))])


async def step_runs(store: Store, workflow_run_id: str) -> dict[str, list]:
    detail = await store.workflows.get_workflow_run("default", workflow_run_id)
    by_step: dict[str, list] = {}
    for step in detail.steps:
        by_step.setdefault(step.step, []).append(step)
    return by_step


async def test_a_changed_definition_is_a_new_version_and_the_same_one_is_not(store):
    first, created = await store.workflows.create_workflow(parse_definition(DIAMOND))
    again, created_again = await store.workflows.create_workflow(parse_definition(DIAMOND))
    changed, created_changed = await store.workflows.create_workflow(parse_definition({**DIAMOND, "failure_policy": "continue"}))
    assert (created, created_again, created_changed) == (True, False, True)
    assert (first.version, again.version, changed.version) == (1, 1, 2)
    assert changed.job_id == first.job_id
    assert (await store.workflows.get_workflow("default", "diamond")).version == 2
    assert (await store.workflows.get_workflow("default", "diamond", 1)).spec.failure_policy.value == "fail_fast"


async def test_steps_are_made_once_however_often_and_by_however_many_stores_a_run_is_advanced(store, make_store):
    await store.workflows.create_workflow(parse_definition(DIAMOND))
    run, changes = await store.workflows.trigger_workflow("default", "diamond", b'{"n": 1}')
    assert [r.step for r in changes.scheduled] == ["a"]
    a = changes.scheduled[0]
    await finish(store, a.run_id, 1, AttemptOutcome.SUCCEEDED, {"from": "a"})
    others = [make_store(shard_count=SHARDS) for _ in range(2)]
    try:
        results = await asyncio.gather(*(s.workflows.advance_workflow_runs([run.workflow_run_id]) for s in [store, *others]),
                                       store.workflows.advance_workflow_runs([run.workflow_run_id]))
    finally:
        for other in others:
            await other.close()
    made = sorted(r.step for changes in results for r in changes.scheduled)
    assert made == ["b", "c"]  # whichever store got there first made them; the others found them made
    steps = await step_runs(store, run.workflow_run_id)
    assert sorted(steps) == ["a", "b", "c"] and all(len(runs) == 1 for runs in steps.values())
    assert orjson.loads(steps["b"][0].output or b"null") is None
    b_payload = orjson.loads((await store.runs.get_run("default", steps["b"][0].run_id)).payload)
    assert b_payload["parents"] == {"a": {"from": "a"}} and b_payload["input"] == {"n": 1}


async def test_the_sweep_finds_a_run_whose_ended_step_was_never_advanced(store):
    await store.workflows.create_workflow(parse_definition(DIAMOND))
    run, changes = await store.workflows.trigger_workflow("default", "diamond", b"")
    shards = list(range(SHARDS))
    assert await store.workflows.workflow_runs_to_advance(shards) == []
    await finish(store, changes.scheduled[0].run_id, 1, AttemptOutcome.SUCCEEDED)  # a node dies here
    assert await store.workflows.workflow_runs_to_advance(shards) == [run.workflow_run_id]
    await store.workflows.advance_workflow_runs([run.workflow_run_id])
    assert await store.workflows.workflow_runs_to_advance(shards) == []


async def test_a_failure_ends_the_run_and_resume_runs_only_what_failed(store):
    await store.workflows.create_workflow(parse_definition(DIAMOND))
    run, changes = await store.workflows.trigger_workflow("default", "diamond", b"")
    await finish(store, changes.scheduled[0].run_id, 1, AttemptOutcome.SUCCEEDED)
    made = await store.workflows.advance_workflow_runs([run.workflow_run_id])
    b = next(r for r in made.scheduled if r.step == "b")
    c = next(r for r in made.scheduled if r.step == "c")
    await finish(store, b.run_id, 2, AttemptOutcome.PERMANENT_FAILURE)
    ended = await store.workflows.advance_workflow_runs([run.workflow_run_id])
    assert [r.run_id for r in ended.cancelled] == [c.run_id]  # fail fast: c had not started
    detail = await store.workflows.get_workflow_run("default", run.workflow_run_id)
    assert detail.run.state is WorkflowRunState.FAILED and "step b failed" in (detail.run.error or "")
    assert (await store.runs.get_run("default", run.workflow_run_id)).state is RunState.DEAD  # the run that started it
    still_running, _ = await store.workflows.trigger_workflow("default", "diamond", b"")
    with pytest.raises(InvalidState):
        await store.workflows.resume_workflow_run("default", still_running.workflow_run_id)

    resumed, again = await store.workflows.resume_workflow_run("default", run.workflow_run_id)
    assert resumed.state is WorkflowRunState.RUNNING
    assert sorted(r.run_id for r in again.scheduled) == sorted([b.run_id, c.run_id])  # not a
    await finish(store, b.run_id, 3, AttemptOutcome.SUCCEEDED)
    await finish(store, c.run_id, 4, AttemptOutcome.SUCCEEDED)
    last = await store.workflows.advance_workflow_runs([run.workflow_run_id])
    d = [r for r in last.scheduled if r.step == "d"]
    assert len(d) == 1
    await finish(store, d[0].run_id, 5, AttemptOutcome.SUCCEEDED)
    await store.workflows.advance_workflow_runs([run.workflow_run_id])
    detail = await store.workflows.get_workflow_run("default", run.workflow_run_id)
    assert detail.run.state is WorkflowRunState.SUCCEEDED
    assert (await store.runs.get_run("default", run.workflow_run_id)).state is RunState.SUCCEEDED


async def test_cancel_ends_queued_steps_asks_running_ones_to_stop_and_is_idempotent(store):
    await store.workflows.create_workflow(parse_definition(DIAMOND))
    run, changes = await store.workflows.trigger_workflow("default", "diamond", b"")
    await finish(store, changes.scheduled[0].run_id, 1, AttemptOutcome.SUCCEEDED)
    made = await store.workflows.advance_workflow_runs([run.workflow_run_id])
    b = next(r for r in made.scheduled if r.step == "b")
    await store.attempts.record_dispatches([Dispatch(run_id=b.run_id, lease_token=9, worker_id="w", node_id="n",
                                            lease_ttl=timedelta(seconds=30), dispatched_at=datetime.now(UTC))])
    cancelled, what = await store.workflows.cancel_workflow_run("default", run.workflow_run_id)
    assert cancelled.state is WorkflowRunState.CANCELLED
    assert [r.step for r in what.cancelled] == ["c"] and [r.step for r in what.cancel_requested] == ["b"]
    again, nothing = await store.workflows.cancel_workflow_run("default", run.workflow_run_id)
    assert again.state is WorkflowRunState.CANCELLED and not (nothing.cancelled or nothing.cancel_requested)


async def test_steps_released_here_are_not_announced_and_the_others_are(store, db_url):
    """A node that advances a workflow run of a shard it owns releases the new steps itself:
    announcing them too would bring them back to it through its own change follower, a second
    release racing the first. Steps of other shards are announced to their owners."""
    changes: list[Change] = []
    listening = asyncio.Event()

    def on_change(change: Change) -> None:
        changes.append(change)
        listening.set()

    await store.workflows.create_workflow(parse_definition(DIAMOND))
    quiet, quiet_changes = await store.workflows.trigger_workflow("default", "diamond", b"")
    told, told_changes = await store.workflows.trigger_workflow("default", "diamond", b"")
    watcher = asyncio.create_task(store.watch_changes(on_change))
    try:
        if store.capabilities.listens:
            await asyncio.wait_for(listening.wait(), 10)  # the listener announces itself once connected
        for changes_made in (quiet_changes, told_changes):
            await finish(store, changes_made.scheduled[0].run_id, 1, AttemptOutcome.SUCCEEDED)
        here = {quiet.shard_id}
        made_quiet = await store.workflows.advance_workflow_runs([quiet.workflow_run_id], released_here=here)
        made_told = await store.workflows.advance_workflow_runs([told.workflow_run_id], released_here=here - {told.shard_id})
        assert sorted(r.step for r in made_quiet.scheduled) == sorted(r.step for r in made_told.scheduled) == ["b", "c"]
        announced = {r.run_id for r in made_told.scheduled} if store.capabilities.listens else set()
        deadline = asyncio.get_running_loop().time() + 10
        while {c.key for c in changes if c.kind == "run"} < announced:
            assert asyncio.get_running_loop().time() < deadline, changes
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # a quiet period: the other steps' notices would have come with those
        assert not {c.key for c in changes if c.kind == "run"} & {r.run_id for r in made_quiet.scheduled}
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def test_workflow_runs_are_found_by_the_start_of_their_id_in_their_tenant_only(store):
    await store.workflows.create_workflow(parse_definition(DIAMOND))
    runs = [(await store.workflows.trigger_workflow("default", "diamond", b""))[0] for _ in range(3)]
    target = runs[1].workflow_run_id
    found = await store.workflows.workflow_runs_by_id_prefix("default", target[:8], limit=2)
    assert target in [run.workflow_run_id for run in found]
    assert all(run.workflow_run_id.startswith(target[:8]) for run in found)
    assert [run.workflow_run_id for run in await store.workflows.workflow_runs_by_id_prefix("default", target, 2)] \
        == [target]
    assert await store.workflows.workflow_runs_by_id_prefix("acme", target[:8], limit=2) == []  # another tenant's
    assert await store.workflows.workflow_runs_by_id_prefix("default", "zzzz", limit=2) == []
