"""Workflow definitions and the decisions of a workflow run, as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from fastlane.domain import workflow_definitions as definitions
from fastlane.domain import workflow_runs as decide
from fastlane.domain import workflows as wf
from fastlane.domain.models import RunState
from fastlane.domain.workflows import StepRun, StepState, WorkflowRun, WorkflowRunState
from fastlane.errors import InvalidArgument

NOW = datetime(2026, 11, 25, tzinfo=UTC)


def spec(*steps: dict, **fields: object) -> wf.WorkflowSpec:
    return definitions.parse_definition({"name": "w", "steps": list(steps), **fields})


def step(name: str, *after: str | dict, **fields: object) -> dict:
    return {"name": name, "job_type": "t", "after": list(after), **fields}


def running(settled: dict | None = None, input_json: bytes = b"null") -> WorkflowRun:
    return WorkflowRun(workflow_run_id="wr", tenant="default", workflow_id="w1", workflow_name="w", version=1,
                       job_id="j", shard_id=0, state=WorkflowRunState.RUNNING, input=input_json, created_at=NOW,
                       updated_at=NOW, settled=settled or {})


def ran(name: str, state: RunState, output: object = None, item: int = 0) -> StepRun:
    return StepRun(step=name, item=item, run_id=f"{name}-{item}", state=state,
                   output=None if output is None else orjson.dumps(output))


# -- definitions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("definition", "field", "problem"), [
    ({"name": "w", "steps": []}, "definition.steps", "list of 1 to 100"),
    ({"name": "w", "steps": [step("a", "a")]}, "definition.steps", "cycle: a -> a"),
    ({"name": "w", "steps": [step("a", "b"), step("b", "a")]}, "definition.steps", "cycle"),
    ({"name": "w", "steps": [step("a", "nope")]}, "definition.steps[0].after[0]", "no step is named 'nope'"),
    ({"name": "w", "steps": [step("a"), step("a")]}, "definition.steps[1].name", "another step"),
    ({"name": "w", "steps": [step("a"), step("b", "a", "a")]}, "definition.steps[1].after[1]", "named twice"),
    ({"name": "w", "steps": [step("a"), step("b", for_each="a")]}, "definition.steps[1].for_each", "a parent"),
    ({"name": "w", "steps": [step("a", job_type="fastlane.workflow")]}, "definition.steps[0].job_type", "reserved"),
    ({"name": "w", "steps": [step("a", {"step": "a", "on": "sometimes"})]}, "definition.steps[0].after[0].on",
     "not one of"),
    ({"name": "w", "steps": [step("a", colour="red")]}, "definition.steps[0].colour", "not a field"),
    ({"name": "w", "steps": [step("a", retry={"max_attempts": 0})]}, "definition.steps[0].retry.max_attempts",
     "out of range"),
    ({"name": "w", "steps": [step("a", timeout_seconds="1")]}, "definition.steps[0].timeout_seconds", "seconds"),
    ({"name": "w", "steps": [step("a")], "schedule": {"cron": "61 * * * *"}}, "spec.schedule", ""),
    ({"name": "w x", "steps": [step("a")]}, "definition.name", "letters"),
    ({"name": "w", "steps": [step("a")], "failure_policy": "panic"}, "definition.failure_policy", "fail_fast"),
])
def test_a_bad_definition_is_refused_naming_the_field(definition: dict, field: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        definitions.parse_definition(definition)
    assert refused.value.field.startswith(field)
    assert problem in refused.value.problem


def test_a_definition_is_stored_in_one_canonical_form_that_reads_back_the_same() -> None:
    first = spec(step("a", params={"k": 1}), step("b", "a", {"step": "a", "on": "always"}) | {"after": ["a"]},
                 schedule={"cron": "0 2 * * *", "timezone": "Europe/Paris"}, input={"x": 1})
    document = definitions.definition_document(first)
    assert definitions.parse_definition(document) == first
    assert definitions.definition_document(definitions.parse_definition(document)) == document
    job = first.schedule_job()
    assert job is not None and job.name == "workflow:w" and job.job_type == wf.WORKFLOW_JOB_TYPE
    assert orjson.loads(job.payload) == {"x": 1}


def test_a_definition_that_is_not_json_or_too_large_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="not JSON"):
        definitions.parse_definition("{")
    with pytest.raises(InvalidArgument, match="over the limit"):
        definitions.parse_definition(" " * (wf.MAX_DEFINITION_BYTES + 1))


# -- advancing a run -------------------------------------------------------------------------------

DIAMOND = spec(step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c"))


def test_a_new_run_makes_its_roots_only() -> None:
    plan = decide.plan_advance(DIAMOND, running(), [])
    assert [new.step.name for new in plan.create] == ["a"] and plan.end is None


def test_a_step_waits_for_every_parent_and_receives_their_outputs() -> None:
    runs = [ran("a", RunState.SUCCEEDED, {"n": 1}), ran("b", RunState.SUCCEEDED, "B"), ran("c", RunState.RUNNING)]
    assert decide.plan_advance(DIAMOND, running(), runs).create == []
    runs[-1] = ran("c", RunState.SUCCEEDED, "C")
    plan = decide.plan_advance(DIAMOND, running(input_json=b'{"in": 2}'), runs)
    assert [new.step.name for new in plan.create] == ["d"]
    payload = orjson.loads(plan.create[0].payload)
    assert payload == {"workflow_run_id": "wr", "step": "d", "input": {"in": 2}, "params": None,
                       "parents": {"b": "B", "c": "C"}}


def test_a_step_already_made_is_never_made_again() -> None:
    runs = [ran("a", RunState.SUCCEEDED), ran("b", RunState.SCHEDULED), ran("c", RunState.SCHEDULED)]
    assert decide.plan_advance(DIAMOND, running(), runs).create == []


def test_the_run_succeeds_when_every_step_has_ended_well() -> None:
    runs = [ran(name, RunState.SUCCEEDED) for name in "abcd"]
    plan = decide.plan_advance(DIAMOND, running(), runs)
    assert plan.end is WorkflowRunState.SUCCEEDED and plan.create == []


def test_fail_fast_ends_the_run_and_cancels_what_runs_and_what_waits() -> None:
    runs = [ran("a", RunState.SUCCEEDED), ran("b", RunState.DEAD), ran("c", RunState.RUNNING)]
    plan = decide.plan_advance(DIAMOND, running(), runs)
    assert plan.end is WorkflowRunState.FAILED and "step b failed" in (plan.error or "")
    assert plan.cancel == ["c-0"]
    assert plan.settle == {"d": wf.SettledStep(state=StepState.CANCELLED, error="cancelled: the workflow run failed")}


def test_continue_lets_independent_branches_finish_and_skips_what_needed_the_failure() -> None:
    flow = spec(step("a"), step("b", "a"), step("c", "a"), step("d", "b"), failure_policy="continue")
    runs = [ran("a", RunState.SUCCEEDED), ran("b", RunState.DEAD), ran("c", RunState.RUNNING)]
    plan = decide.plan_advance(flow, running(), runs)
    assert plan.end is None and plan.cancel == [] and plan.settle["d"].state is StepState.SKIPPED
    runs[-1] = ran("c", RunState.SUCCEEDED)
    plan = decide.plan_advance(flow, running({"d": wf.SettledStep(state=StepState.SKIPPED)}), runs)
    assert plan.end is WorkflowRunState.FAILED


def test_an_on_failure_edge_handles_a_failure_and_always_runs_either_way() -> None:
    flow = spec(step("a"), step("undo", {"step": "a", "on": "on_failure"}), step("next", "a"),
                step("log", {"step": "a", "on": "always"}))
    plan = decide.plan_advance(flow, running(), [ran("a", RunState.DEAD)])
    assert sorted(new.step.name for new in plan.create) == ["log", "undo"]
    assert plan.settle["next"].state is StepState.SKIPPED and plan.end is None  # handled: no fail fast
    plan = decide.plan_advance(flow, running(), [ran("a", RunState.SUCCEEDED)])
    assert sorted(new.step.name for new in plan.create) == ["log", "next"]
    assert plan.settle["undo"].state is StepState.SKIPPED


def test_a_fan_out_makes_one_run_per_item_and_its_children_get_every_output_in_order() -> None:
    flow = spec(step("list"), step("each", "list", for_each="list.items"), step("sum", "each"))
    plan = decide.plan_advance(flow, running(), [ran("list", RunState.SUCCEEDED, {"items": ["x", "y", "z"]})])
    assert [(new.step.name, new.item, orjson.loads(new.payload)["item"]) for new in plan.create] == [
        ("each", 0, "x"), ("each", 1, "y"), ("each", 2, "z")]
    runs = [ran("list", RunState.SUCCEEDED, {"items": [1, 2, 3]}),
            *(ran("each", RunState.SUCCEEDED, 10 * i, item=i) for i in (2, 0, 1))]
    plan = decide.plan_advance(flow, running(), runs)
    assert [new.step.name for new in plan.create] == ["sum"]
    assert orjson.loads(plan.create[0].payload)["parents"] == {"each": [0, 10, 20]}


def test_a_fan_out_over_nothing_succeeds_and_over_a_non_list_fails_with_its_reason() -> None:
    flow = spec(step("each", for_each="input.items"), step("after", "each"))
    plan = decide.plan_advance(flow, running(input_json=b'{"items": []}'), [])
    assert plan.settle["each"].state is StepState.SUCCEEDED and [n.step.name for n in plan.create] == ["after"]
    plan = decide.plan_advance(flow, running(input_json=b'{"items": 5}'), [])
    assert plan.settle["each"].state is StepState.FAILED and "not a list" in (plan.settle["each"].error or "")
    too_many = orjson.dumps({"items": list(range(wf.MAX_FAN_OUT + 1))})
    plan = decide.plan_advance(flow, running(input_json=too_many), [])
    assert "over the limit" in (plan.settle["each"].error or "")


def test_a_step_whose_input_is_too_large_is_made_dead_with_its_reason() -> None:
    flow = spec(step("a"), step("b", "a"))
    plan = decide.plan_advance(flow, running(), [ran("a", RunState.SUCCEEDED, "x" * 2000)], max_payload=1000)
    assert plan.create[0].state is RunState.DEAD and "over the payload limit" in (plan.create[0].last_error or "")


def test_resume_runs_failed_and_cancelled_steps_again_and_decides_the_rest_afresh() -> None:
    runs = [ran("a", RunState.SUCCEEDED), ran("b", RunState.DEAD), ran("c", RunState.CANCELLED)]
    settled = {"d": wf.SettledStep(state=StepState.CANCELLED)}
    again, kept = decide.resume_targets(DIAMOND, runs, settled)
    assert sorted(again) == ["b-0", "c-0"] and kept == {}


def test_a_handlers_output_is_kept_only_when_it_is_json_within_its_bound() -> None:
    assert definitions.output_of(b'{"ok": true}') == b'{"ok": true}'
    assert definitions.output_of(b"not json") == b""
    assert definitions.output_of(b'"' + b"x" * wf.MAX_OUTPUT_BYTES + b'"') == b""
