"""Workflow definitions: the JSON document people write, checked in one place, and its canonical form.

See :mod:`fastlane.domain.workflows` for what a workflow is and the document's shape.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

import orjson

from fastlane.domain import validation
from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES, MAX_LEASE_TTL, MAX_TIMEOUT, MIN_LEASE_TTL
from fastlane.domain.models import DEFAULT_TENANT, MisfireKind, MisfirePolicy, OverlapPolicy, RetryPolicy, Schedule
from fastlane.domain.workflows import (
    MAX_DEFINITION_BYTES,
    MAX_EDGES_PER_STEP,
    MAX_NAME_LENGTH,
    MAX_OUTPUT_BYTES,
    MAX_STEPS,
    WORKFLOW_JOB_TYPE,
    Edge,
    EdgeCondition,
    FailurePolicy,
    StepSpec,
    WorkflowSpec,
)
from fastlane.errors import InvalidArgument

E = TypeVar("E", bound=StrEnum)



def parse_definition(document: bytes | str | Mapping[str, Any], *, tenant: str = DEFAULT_TENANT,
                     max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> WorkflowSpec:
    """Check a definition and return it as a spec, or raise :class:`InvalidArgument` naming the
    field (``definition.steps[2].after[0]``) and what is wrong with it."""
    if isinstance(document, (bytes, str)):
        if len(document) > MAX_DEFINITION_BYTES:
            raise InvalidArgument("definition", f"{len(document)} bytes is over the limit of {MAX_DEFINITION_BYTES}")
        try:
            document = orjson.loads(document)
        except orjson.JSONDecodeError as error:
            raise InvalidArgument("definition", f"is not JSON: {error}") from None
    doc = _object("definition", document, {"name", "steps", "failure_policy", "schedule", "input", "overlap",
                                           "misfire"})
    name = _name("definition.name", doc.get("name"))
    raw_steps = doc.get("steps")
    if not isinstance(raw_steps, list) or not 1 <= len(raw_steps) <= MAX_STEPS:
        raise InvalidArgument("definition.steps", f"must be a list of 1 to {MAX_STEPS} steps")
    steps = tuple(_step(f"definition.steps[{i}]", raw, max_payload) for i, raw in enumerate(raw_steps))
    _check_graph(steps)
    schedule = None if doc.get("schedule") is None else _schedule("definition.schedule", doc["schedule"])
    input_value = doc.get("input")
    if len(orjson.dumps(input_value)) > max_payload:
        raise InvalidArgument("definition.input", f"is over the payload limit of {max_payload} bytes")
    spec = WorkflowSpec(
        name=name, tenant=validation.name("tenant", tenant), steps=steps,
        failure_policy=_choice("definition.failure_policy", doc.get("failure_policy", "fail_fast"), FailurePolicy),
        schedule=schedule, input=input_value,
        overlap=_choice("definition.overlap", doc.get("overlap", "allow"), OverlapPolicy),
        misfire=_misfire("definition.misfire", doc.get("misfire", {})),
    )
    if (job := spec.schedule_job()) is not None:
        validation.validate_spec(job, max_payload=max_payload)
    return spec


def definition_document(spec: WorkflowSpec) -> str:
    """The canonical JSON of a spec: what is stored, compared and shown."""
    doc: dict[str, Any] = {"name": spec.name, "failure_policy": spec.failure_policy.value,
                           "steps": [_step_document(step) for step in spec.steps]}
    if spec.schedule is not None:
        doc["schedule"] = _schedule_document(spec.schedule)
    if spec.input is not None:
        doc["input"] = spec.input
    if spec.overlap is not OverlapPolicy.ALLOW:
        doc["overlap"] = spec.overlap.value
    if spec.misfire != MisfirePolicy():
        doc["misfire"] = {"kind": spec.misfire.kind.value, "grace_seconds": spec.misfire.grace.total_seconds(),
                          "fire_all_cap": spec.misfire.fire_all_cap}
    return orjson.dumps(doc).decode()


def _step(where: str, raw: Any, max_payload: int) -> StepSpec:
    doc = _object(where, raw, {"name", "job_type", "params", "after", "for_each", "retry", "timeout_seconds",
                               "lease_ttl_seconds", "priority"})
    if len(orjson.dumps(doc.get("params"))) > max_payload:
        raise InvalidArgument(f"{where}.params", f"is over the payload limit of {max_payload} bytes")
    job_type = validation.name(f"{where}.job_type", _string(f"{where}.job_type", doc.get("job_type")))
    if job_type == WORKFLOW_JOB_TYPE:
        raise InvalidArgument(f"{where}.job_type", f"{WORKFLOW_JOB_TYPE!r} is reserved for the runs that start workflows")
    after = doc.get("after", [])
    if not isinstance(after, list) or len(after) > MAX_EDGES_PER_STEP:
        raise InvalidArgument(f"{where}.after", f"must be a list of at most {MAX_EDGES_PER_STEP} edges")
    for_each = doc.get("for_each")
    if for_each is not None:
        for_each = validation.name(f"{where}.for_each", _string(f"{where}.for_each", for_each))
    retry = _object(f"{where}.retry", doc.get("retry", {}), {"max_attempts", "backoff_base_seconds",
                                                              "backoff_cap_seconds"})
    policy = RetryPolicy(
        max_attempts=validation.count(f"{where}.retry.max_attempts", _int(f"{where}.retry.max_attempts",
                                                                          retry.get("max_attempts", 3)), 1, 1_000),
        backoff_base=_seconds(f"{where}.retry.backoff_base_seconds", retry.get("backoff_base_seconds", 1.0),
                              timedelta(milliseconds=1), timedelta(days=7)),
        backoff_cap=_seconds(f"{where}.retry.backoff_cap_seconds", retry.get("backoff_cap_seconds", 300.0),
                             timedelta(milliseconds=1), timedelta(days=7)),
    )
    if policy.backoff_cap < policy.backoff_base:
        raise InvalidArgument(f"{where}.retry.backoff_cap_seconds", "must be at least backoff_base_seconds")
    timeout = doc.get("timeout_seconds")
    return StepSpec(
        name=_name(f"{where}.name", doc.get("name")),
        job_type=job_type,
        params=doc.get("params"),
        after=tuple(_edge(f"{where}.after[{i}]", edge) for i, edge in enumerate(after)),
        for_each=for_each,
        retry=policy,
        timeout=None if timeout is None else _seconds(f"{where}.timeout_seconds", timeout, timedelta(milliseconds=1),
                                                      MAX_TIMEOUT),
        lease_ttl=_seconds(f"{where}.lease_ttl_seconds", doc.get("lease_ttl_seconds", 30.0), MIN_LEASE_TTL,
                           MAX_LEASE_TTL),
        priority=validation.count(f"{where}.priority", _int(f"{where}.priority", doc.get("priority", 0)), -1000, 1000),
    )


def _step_document(step: StepSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": step.name, "job_type": step.job_type}
    if step.params is not None:
        doc["params"] = step.params
    if step.after:
        doc["after"] = [edge.parent if edge.condition is EdgeCondition.ON_SUCCESS
                        else {"step": edge.parent, "on": edge.condition.value} for edge in step.after]
    if step.for_each is not None:
        doc["for_each"] = step.for_each
    if step.retry != RetryPolicy():
        doc["retry"] = {"max_attempts": step.retry.max_attempts,
                        "backoff_base_seconds": step.retry.backoff_base.total_seconds(),
                        "backoff_cap_seconds": step.retry.backoff_cap.total_seconds()}
    if step.timeout is not None:
        doc["timeout_seconds"] = step.timeout.total_seconds()
    if step.lease_ttl != timedelta(seconds=30):
        doc["lease_ttl_seconds"] = step.lease_ttl.total_seconds()
    if step.priority:
        doc["priority"] = step.priority
    return doc


def _edge(where: str, raw: Any) -> Edge:
    if isinstance(raw, str):
        return Edge(_name(where, raw))
    doc = _object(where, raw, {"step", "on"})
    return Edge(_name(f"{where}.step", doc.get("step")), _choice(f"{where}.on", doc.get("on", "on_success"),
                                                                  EdgeCondition))


def _check_graph(steps: Sequence[StepSpec]) -> None:
    """Names unique, every edge to a step that exists, no cycle, ``for_each`` sources resolvable."""
    index = {}
    for i, step in enumerate(steps):
        if step.name in index:
            raise InvalidArgument(f"definition.steps[{i}].name", f"{step.name!r} is the name of another step")
        index[step.name] = i
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for i, step in enumerate(steps):
        parents = [edge.parent for edge in step.after]
        for j, parent in enumerate(parents):
            if parent not in index:
                raise InvalidArgument(f"definition.steps[{i}].after[{j}]", f"no step is named {parent!r}")
            if parents.index(parent) != j:
                raise InvalidArgument(f"definition.steps[{i}].after[{j}]", f"{parent!r} is named twice")
        sorter.add(step.name, *parents)
        if step.for_each is not None:
            source = step.for_each.split(".", 1)[0]
            if source != "input" and source not in parents:
                raise InvalidArgument(f"definition.steps[{i}].for_each",
                                      f"{step.for_each!r} must be input, input.<key>, or a parent's <step>[.<key>]")
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        cycle = " -> ".join(error.args[1])
        raise InvalidArgument("definition.steps", f"the edges make a cycle: {cycle}") from None


def topological(spec: WorkflowSpec) -> list[StepSpec]:
    """The steps, parents before children (and otherwise in the definition's order)."""
    order: list[StepSpec] = []
    placed: set[str] = set()
    remaining = list(spec.steps)
    while remaining:  # at most MAX_STEPS passes over at most MAX_STEPS steps
        for step in list(remaining):
            if all(edge.parent in placed for edge in step.after):
                order.append(step)
                placed.add(step.name)
                remaining.remove(step)
    return order


def _schedule(where: str, raw: Any) -> Schedule:
    doc = _object(where, raw, {"cron", "timezone", "every_seconds", "at", "now"})
    if "cron" in doc:
        return Schedule.cron_expr(_string(f"{where}.cron", doc["cron"]), _string(f"{where}.timezone",
                                                                                   doc.get("timezone", "UTC")))
    if "every_seconds" in doc:
        return Schedule.interval(_seconds(f"{where}.every_seconds", doc["every_seconds"], timedelta(milliseconds=100),
                                          timedelta(days=36_600)))
    if "at" in doc:
        try:
            at = datetime.fromisoformat(_string(f"{where}.at", doc["at"]).replace("Z", "+00:00"))
        except ValueError:
            raise InvalidArgument(f"{where}.at", "must be an RFC 3339 instant, e.g. 2027-01-01T09:00:00Z") from None
        return Schedule.at_instant(validation.instant(f"{where}.at", at))
    if doc.get("now") is True:
        return Schedule.now()
    raise InvalidArgument(where, 'must be {"cron": ..., "timezone": ...}, {"every_seconds": N}, {"at": ...} or {"now": true}')


def _schedule_document(schedule: Schedule) -> dict[str, Any]:
    if schedule.cron is not None:
        return {"cron": schedule.cron, "timezone": schedule.timezone}
    if schedule.every is not None:
        return {"every_seconds": schedule.every.total_seconds()}
    if schedule.at is not None:
        return {"at": schedule.at.isoformat().replace("+00:00", "Z")}
    return {"now": True}


def _misfire(where: str, raw: Any) -> MisfirePolicy:
    doc = _object(where, raw, {"kind", "grace_seconds", "fire_all_cap"})
    return MisfirePolicy(
        kind=_choice(f"{where}.kind", doc.get("kind", "fire_once"), MisfireKind),
        grace=_seconds(f"{where}.grace_seconds", doc.get("grace_seconds", 10.0), timedelta(0), timedelta(days=366)),
        fire_all_cap=validation.count(f"{where}.fire_all_cap", _int(f"{where}.fire_all_cap",
                                                                    doc.get("fire_all_cap", 100)), 1, 10_000),
    )


def _object(where: str, raw: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidArgument(where, "must be a JSON object")
    if unknown := sorted(set(raw) - allowed):
        raise InvalidArgument(f"{where}.{unknown[0]}", f"is not a field here (fields: {', '.join(sorted(allowed))})")
    return raw


def _string(where: str, raw: Any) -> str:
    if not isinstance(raw, str):
        raise InvalidArgument(where, "must be a string")
    return validation.text(where, raw, max_length=1_000)


def _name(where: str, raw: Any) -> str:
    value = validation.name(where, _string(where, raw))
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(where, f"must be at most {MAX_NAME_LENGTH} characters")
    return value


def _int(where: str, raw: Any) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise InvalidArgument(where, "must be an integer")
    return raw


def _seconds(where: str, raw: Any, low: timedelta, high: timedelta) -> timedelta:
    if not isinstance(raw, (int, float)) or isinstance(raw, bool) or raw != raw:
        raise InvalidArgument(where, "must be a number of seconds")
    if not low.total_seconds() <= raw <= high.total_seconds():
        raise InvalidArgument(where, f"{raw:g} s is out of range [{low.total_seconds():g} s, {high.total_seconds():g} s]")
    return timedelta(seconds=raw)


def _choice(where: str, raw: Any, kind: type[E]) -> E:
    try:
        return kind(raw)
    except ValueError:
        raise InvalidArgument(where, f"{raw!r} is not one of {', '.join(kind)}") from None


def parse_input(raw: bytes, max_payload: int) -> Any:
    """A trigger's input: JSON (empty: null), within the payload limit."""
    validation.payload("input", raw, max_payload)
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise InvalidArgument("input", f"is not JSON: {error}") from None


def output_of(raw: bytes) -> bytes:
    """A handler's output as kept: JSON within MAX_OUTPUT_BYTES (anything else is dropped)."""
    if not raw or len(raw) > MAX_OUTPUT_BYTES:
        return b""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return b""
    return raw


