"""What a workflow run does next: a pure function of its definition and its step runs as stored.

Any node may decide it again at any time (after a failover, or a result delivered twice) and reach
the same answer; the stores apply it under a lock on the workflow run's row
(:mod:`fastlane.storage.workflows`). See :mod:`fastlane.domain.workflows` for the semantics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES
from fastlane.domain.models import RunState
from fastlane.domain.workflow_definitions import topological
from fastlane.domain.workflows import (
    MAX_FAN_OUT,
    AdvancePlan,
    Edge,
    EdgeCondition,
    FailurePolicy,
    NewStepRun,
    SettledStep,
    StepRun,
    StepSpec,
    StepState,
    StepView,
    WorkflowRun,
    WorkflowRunState,
    WorkflowSpec,
)

_FAILED_RUNS = frozenset({RunState.DEAD, RunState.LOST, RunState.FAILED})


def step_states(spec: WorkflowSpec, runs: Sequence[StepRun], settled: Mapping[str, SettledStep]) -> dict[str, StepState]:
    """Each step's state from its runs (or its settled record, or WAITING with neither)."""
    by_step: dict[str, list[StepRun]] = {}
    for run in runs:
        by_step.setdefault(run.step, []).append(run)
    states = {}
    for step in spec.steps:
        if step.name in settled:
            states[step.name] = settled[step.name].state
        elif (its := by_step.get(step.name)) is not None:
            states[step.name] = _state_of_runs(its)
        else:
            states[step.name] = StepState.WAITING
    return states


def _state_of_runs(runs: Sequence[StepRun]) -> StepState:
    if any(not run.state.is_final for run in runs):
        return StepState.ACTIVE
    if all(run.state is RunState.SUCCEEDED for run in runs):
        return StepState.SUCCEEDED
    if any(run.state in _FAILED_RUNS for run in runs):
        return StepState.FAILED
    return StepState.CANCELLED  # cancelled (or skipped) without a failure


def _edge_holds(edge: Edge, parent: StepState) -> bool:
    if edge.condition is EdgeCondition.ALWAYS:
        return True
    if edge.condition is EdgeCondition.ON_FAILURE:
        return parent is StepState.FAILED
    return parent is StepState.SUCCEEDED


def unhandled_failures(spec: WorkflowSpec, states: Mapping[str, StepState]) -> list[str]:
    """Failed or cancelled steps no ``on_failure`` edge takes care of: they fail the workflow run."""
    return [step.name for step in spec.steps
            if states[step.name] in (StepState.FAILED, StepState.CANCELLED)
            and not any(edge.condition is EdgeCondition.ON_FAILURE for _, edge in spec.children(step.name))]


def plan_advance(spec: WorkflowSpec, workflow_run: WorkflowRun, runs: Sequence[StepRun], *,
                 max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> AdvancePlan:
    """What a running workflow run does next, given its step runs as stored now."""
    plan = AdvancePlan()
    if workflow_run.state is not WorkflowRunState.RUNNING:
        return plan
    settled = dict(workflow_run.settled)
    states = step_states(spec, runs, settled)
    outputs = _outputs(runs)
    failures = unhandled_failures(spec, states)
    if failures and spec.failure_policy is FailurePolicy.FAIL_FAST:
        return _fail_fast(spec, states, runs, failures)
    input_value = _json(workflow_run.input)
    for step in topological(spec):
        if states[step.name] is not StepState.WAITING:
            continue
        parents = [states[edge.parent] for edge in step.after]
        if not all(parent.ended for parent in parents):
            continue
        if not all(_edge_holds(edge, state) for edge, state in zip(step.after, parents, strict=True)):
            plan.settle[step.name] = SettledStep(state=StepState.SKIPPED)
            states[step.name] = StepState.SKIPPED  # its children, later in this loop, see it ended
            continue
        created = _new_runs(spec, step, workflow_run, input_value, outputs, max_payload)
        if isinstance(created, SettledStep):
            plan.settle[step.name] = created
            states[step.name] = created.state
        else:
            plan.create += created
            states[step.name] = StepState.ACTIVE
    if all(state.ended for state in states.values()):
        failures = unhandled_failures(spec, states)
        plan.end = WorkflowRunState.FAILED if failures else WorkflowRunState.SUCCEEDED
        plan.error = _failure_text(failures, runs, {**settled, **plan.settle}) if failures else None
    return plan


def _fail_fast(spec: WorkflowSpec, states: Mapping[str, StepState], runs: Sequence[StepRun],
               failures: list[str]) -> AdvancePlan:
    plan = AdvancePlan(end=WorkflowRunState.FAILED, error=_failure_text(failures, runs, {}))
    plan.cancel += [run.run_id for run in runs if not run.state.is_final]
    for step in spec.steps:
        if states[step.name] is StepState.WAITING:
            plan.settle[step.name] = SettledStep(state=StepState.CANCELLED, error="cancelled: the workflow run failed")
    return plan


def plan_cancel(spec: WorkflowSpec, runs: Sequence[StepRun], settled: Mapping[str, SettledStep]) -> AdvancePlan:
    """Cancel a running workflow run: its unfinished runs and its steps not yet created."""
    states = step_states(spec, runs, settled)
    plan = AdvancePlan(end=WorkflowRunState.CANCELLED, error="cancelled by request")
    plan.cancel += [run.run_id for run in runs if not run.state.is_final]
    for step in spec.steps:
        if states[step.name] is StepState.WAITING:
            plan.settle[step.name] = SettledStep(state=StepState.CANCELLED, error="cancelled by request")
    return plan


def resume_targets(spec: WorkflowSpec, runs: Sequence[StepRun],
                   settled: Mapping[str, SettledStep]) -> tuple[list[str], dict[str, SettledStep]]:
    """What resuming an ended workflow run does: the runs to schedule again (every run of a
    failed or cancelled step that did not succeed) and the settled steps kept (the others are
    decided afresh: a step skipped or cancelled because of the failure may run now)."""
    states = step_states(spec, runs, settled)
    again = [run.run_id for run in runs
             if states[run.step] in (StepState.FAILED, StepState.CANCELLED) and run.state is not RunState.SUCCEEDED
             and run.step not in settled]
    kept = {name: value for name, value in settled.items() if value.state is StepState.SUCCEEDED}
    return again, kept


def _failure_text(failures: Sequence[str], runs: Sequence[StepRun], settled: Mapping[str, SettledStep]) -> str:
    parts = []
    for name in failures:
        error = next((run.last_error for run in runs if run.step == name and run.last_error), None)
        error = error or (settled[name].error if name in settled else None)
        parts.append(f"step {name} failed" + (f": {error}" if error else ""))
    return "; ".join(parts)[:4_000]


def _outputs(runs: Sequence[StepRun]) -> dict[str, list[tuple[int, Any]]]:
    outputs: dict[str, list[tuple[int, Any]]] = {}
    for run in runs:
        if run.state is RunState.SUCCEEDED:
            outputs.setdefault(run.step, []).append((run.item, _json(run.output)))
    return outputs


def _new_runs(spec: WorkflowSpec, step: StepSpec, workflow_run: WorkflowRun, input_value: Any,
              outputs: Mapping[str, list[tuple[int, Any]]], max_payload: int) -> list[NewStepRun] | SettledStep:
    parents: dict[str, Any] = {}
    for edge in step.after:
        produced = [value for _, value in sorted(outputs.get(edge.parent, []), key=lambda pair: pair[0])]
        # A fan-out parent hands over the list of its items' outputs (fan-in); another, its one output.
        parents[edge.parent] = produced if spec.step(edge.parent).for_each is not None else next(iter(produced), None)
    base = {"workflow_run_id": workflow_run.workflow_run_id, "step": step.name, "input": input_value,
            "params": step.params, "parents": parents}
    if step.for_each is None:
        return [_new_run(step, 0, base, max_payload)]
    items = _items(step.for_each, input_value, parents)
    if isinstance(items, SettledStep):
        return items
    if not items:
        return SettledStep(state=StepState.SUCCEEDED)
    return [_new_run(step, index, {**base, "item": item, "index": index}, max_payload)
            for index, item in enumerate(items)]


def _items(source: str, input_value: Any, parents: Mapping[str, Any]) -> list[Any] | SettledStep:
    head, _, key = source.partition(".")
    value = input_value if head == "input" else parents.get(head)
    if key:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, list):
        return SettledStep(state=StepState.FAILED, error=f"for_each {source!r} is not a list")
    if len(value) > MAX_FAN_OUT:
        return SettledStep(state=StepState.FAILED,
                           error=f"for_each {source!r} has {len(value)} items, over the limit of {MAX_FAN_OUT}")
    return value


def _new_run(step: StepSpec, item: int, payload: dict[str, Any], max_payload: int) -> NewStepRun:
    encoded = orjson.dumps(payload)
    if len(encoded) > max_payload:
        # Set aside with its reason: a run that could not be made ends dead, and the rest goes on.
        return NewStepRun(step=step, item=item, payload=b"", state=RunState.DEAD,
                          last_error=f"its input (parents' outputs included) is {len(encoded)} bytes, "
                                     f"over the payload limit of {max_payload}")
    return NewStepRun(step=step, item=item, payload=encoded)


def _json(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def step_views(spec: WorkflowSpec, runs: Sequence[StepRun], settled: Mapping[str, SettledStep]) -> list[StepView]:
    """Each step of a workflow run for people, in the definition's order."""
    states = step_states(spec, runs, settled)
    views = []
    for step in spec.steps:
        its = sorted((run for run in runs if run.step == step.name), key=lambda run: run.item)
        error = settled[step.name].error if step.name in settled else next(
            (run.last_error for run in its if run.last_error and run.state is not RunState.SUCCEEDED), None)
        views.append(StepView(name=step.name, state=states[step.name], run_ids=tuple(run.run_id for run in its),
                              run_states=tuple(run.state for run in its), items=len(its), error=error,
                              outputs=tuple(run.output for run in its)))
    return views


def settled_document(settled: Mapping[str, SettledStep]) -> str:
    return orjson.dumps({name: {"state": value.state.value, "error": value.error}
                         for name, value in settled.items()}).decode()


def settled_from_document(raw: str | None) -> dict[str, SettledStep]:
    if not raw:
        return {}
    return {name: SettledStep(state=StepState(value["state"]), error=value.get("error"))
            for name, value in orjson.loads(raw).items()}
