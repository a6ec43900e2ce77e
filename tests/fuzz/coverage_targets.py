"""The parsers and validators that take untrusted bytes, as targets for a coverage-guided fuzzer.

Each target takes raw bytes, reads them as its input would arrive (a protobuf message off the
wire, a form posted to the console, a workflow definition, a page token) and runs everything the
node does with that input before it touches the database: decode, validate, and for a job that
passes, plan its fire times. The input may be refused, with the error the caller is sent
(:class:`~fastlane.errors.FastlaneError` and its subclasses, or a protobuf decode error for bytes
that are no message at all); any other exception is a crash: the kind of input that would make a
node raise where it should have answered.

The seeds come from the strategies the hypothesis suites draw from (``strategies.py``), so the
fuzzer starts where those suites already reach. ``coverage_fuzz.py`` runs a target under atheris;
``test_coverage_fuzz.py`` replays every seed and every crash kept in ``crashes/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NonInteractiveExampleWarning

CRASHES = Path(__file__).parent / "crashes"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # a fixed instant: a target's verdict must not depend on the day


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    check: Callable[[bytes], None]  # raises only for a crash
    seeds: Callable[[int], Iterator[bytes]]  # a few inputs to start from


def _refused(*errors: type[BaseException]) -> contextlib.AbstractContextManager[None]:
    """The errors that are an answer, not a crash."""
    from fastlane.errors import FastlaneError

    return contextlib.suppress(FastlaneError, DecodeError, *errors)


# -- a job spec, as CreateJob and UpdateJob take it ---------------------------------------------


def check_job_spec(data: bytes) -> None:
    from fastlane._proto import common_pb2
    from fastlane.domain import schedules, validation
    from fastlane.domain.models import ScheduleKind
    from fastlane.rpc import wire

    with _refused():
        message = common_pb2.JobSpec.FromString(data)
        spec = validation.validate_spec(wire.spec_from_pb(message, tenant=message.tenant or None))
        # A job the API accepts is one the node can plan: its fire times come next.
        schedule = spec.schedule
        if schedule.kind is ScheduleKind.INTERVAL and schedule.anchor is None:
            schedule = dataclasses.replace(schedule, anchor=NOW)  # as the store anchors it on creation
        first = schedules.first_fire(schedule, NOW)
        if first is not None:
            schedules.next_fire_after(schedule, first)
            schedules.preview(schedule, NOW, 5)


def job_spec_seeds(count: int) -> Iterator[bytes]:
    from strategies import fuzzed_specs, valid_specs

    for example in _examples(valid_specs(), count // 2):
        yield example.SerializeToString()
    for spec, _fields in _examples(fuzzed_specs(), count - count // 2):
        yield spec.SerializeToString()


# -- a workflow definition and a trigger's input ------------------------------------------------


def check_workflow(data: bytes) -> None:
    from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES
    from fastlane.domain.workflow_definitions import parse_definition, parse_input

    with _refused():
        parse_definition(data)
    with _refused():
        parse_input(data, DEFAULT_MAX_PAYLOAD_BYTES)


def workflow_seeds(count: int) -> Iterator[bytes]:
    import orjson
    from strategies import create_workflow

    yield orjson.dumps({"name": "w", "steps": [{"name": "a", "job_type": "t"},
                                               {"name": "b", "job_type": "t", "after": ["a"]}]})
    for probe in _examples(create_workflow(), count - 1):
        yield probe.build(_memory()).definition.encode()


# -- a worker's stream message ------------------------------------------------------------------


def check_worker_message(data: bytes) -> None:
    from fastlane._proto import workers_pb2
    from fastlane.domain import validation
    from fastlane.server.servicers import workers

    with _refused():
        message = workers_pb2.ConnectRequest.FromString(data)
        body = message.WhichOneof("body")
        if body == "hello":
            workers.validate_hello(message.hello)
        elif body == "credit":
            validation.count("credit.credits", message.credit.credits, 0, workers.MAX_CREDITS)
        elif body == "heartbeats":
            workers.heartbeats_of(message.heartbeats)
        elif body == "results":
            workers.results_of(message.results)
            workers.results_of(message.results, worker_offset=timedelta(milliseconds=-3))
        elif body == "clock_probe":
            workers.clock_probe_of(message.clock_probe)


def worker_message_seeds(count: int) -> Iterator[bytes]:
    from strategies import clock_probes, credits, heartbeats, hellos, results

    kinds = (hellos(), credits(), heartbeats(), results(), clock_probes())
    per_kind = max(1, count // len(kinds))
    for kind in kinds:
        for step in _examples(kind, per_kind):
            yield step.build(_memory(), []).SerializeToString()  # no assignment yet: made-up run ids


# -- the console's job form ---------------------------------------------------------------------


def check_console_form(data: bytes) -> None:
    from fastlane.console.forms import JobForm
    from fastlane.domain import schedules, validation

    fields = dict(parse_qsl(data.decode("utf-8", errors="replace"), keep_blank_values=True))
    with _refused():
        spec = validation.validate_spec(JobForm.from_fields(fields).spec(tenant="default"))
        schedules.first_fire(spec.schedule, NOW)


def console_form_seeds(count: int) -> Iterator[bytes]:
    from strategies import STRING_EDGES

    rng = random.Random(20261202)
    base = {"name": "fuzz", "job_type": "fuzz", "schedule": "interval", "every_seconds": "3600"}
    yield urlencode(base).encode()
    fields = ("name", "job_type", "schedule", "cron", "timezone", "at", "every_seconds", "payload",
              "max_attempts", "priority")
    for _ in range(count - 1):
        form = dict(base)
        for field in rng.sample(fields, rng.randint(1, 4)):
            form[field] = rng.choice((*STRING_EDGES, "now", "at", "cron", "*/5 * * * *", "2026-06-01T00:00:00Z"))
        yield urlencode(form).encode()


# -- a page token, as every listing takes it back ----------------------------------------------


def check_page_token(data: bytes) -> None:
    from fastlane.storage.codec import decode_page_token

    token = data.decode("utf-8", errors="replace")
    with _refused():
        decode_page_token(token, int, str)
    with _refused():
        decode_page_token(token, str)


def page_token_seeds(count: int) -> Iterator[bytes]:
    from strategies import PAGE_TOKEN_EDGES

    from fastlane.storage.codec import encode_page_token

    yield encode_page_token(1_780_000_000_000_000, "run-1").encode()
    yield encode_page_token("job-1").encode()
    for token in list(PAGE_TOKEN_EDGES)[: max(0, count - 2)]:
        yield token.encode()


TARGETS = {target.name: target for target in (
    Target("job_spec", check_job_spec, job_spec_seeds),
    Target("workflow", check_workflow, workflow_seeds),
    Target("worker_message", check_worker_message, worker_message_seeds),
    Target("console_form", check_console_form, console_form_seeds),
    Target("page_token", check_page_token, page_token_seeds),
)}


def kept_crashes(name: str) -> list[Path]:
    """The inputs a fuzzer found to crash a target, kept once the cause was fixed."""
    folder = CRASHES / name
    return sorted(path for path in folder.iterdir() if path.is_file() and not path.name.startswith(".")) \
        if folder.is_dir() else []


# -- drawing from the hypothesis strategies outside a test --------------------------------------


def _examples(strategy: st.SearchStrategy[object], count: int) -> list:  # type: ignore[type-arg]
    """``count`` examples of ``strategy``, the same on every call (seeded)."""
    drawn: list[object] = []

    @settings(max_examples=count, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: object) -> None:
        if len(drawn) < count:
            drawn.append(example)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        collect()
    return drawn


def _memory():  # noqa: ANN202 - the strategies' Memory, empty
    from strategies import Memory

    return Memory()
