"""A job spec from the flags of ``jobs create`` and ``jobs update``, checked before any call is made."""

from __future__ import annotations

import argparse
from dataclasses import replace
from datetime import timedelta
from typing import Any

from fastlane.cli.arguments import UsageError, instant_flag, json_document, schedule_from_flags
from fastlane.domain.models import (
    DEFAULT_TENANT,
    Delivery,
    JobSpec,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Schedule,
    ScheduleKind,
)
from fastlane.domain.schedules import zone
from fastlane.domain.validation import validate_spec


def spec_from_flags(args: argparse.Namespace) -> JobSpec:
    """The job spec ``jobs create`` sends, validated locally so mistakes need no daemon to report."""
    # Flags left out keep the model's defaults, so the CLI and the SDK create identical jobs.
    options: dict[str, Any] = {}
    retry = RetryPolicy()
    if args.max_attempts is not None:
        retry = replace(retry, max_attempts=args.max_attempts)
    if args.max_retry_time is not None:
        retry = replace(retry, max_retry_time=timedelta(seconds=args.max_retry_time))
    if args.backoff_base is not None:
        retry = replace(retry, backoff_base=timedelta(seconds=args.backoff_base))
    if args.backoff_cap is not None:
        retry = replace(retry, backoff_cap=timedelta(seconds=args.backoff_cap))
    if retry != RetryPolicy():
        options["retry"] = retry
    misfire = MisfirePolicy()
    if args.misfire is not None:
        misfire = replace(misfire, kind=MisfireKind(args.misfire))
    if args.misfire_grace is not None:
        misfire = replace(misfire, grace=timedelta(seconds=args.misfire_grace))
    if args.fire_all_cap is not None:
        misfire = replace(misfire, fire_all_cap=args.fire_all_cap)
    if misfire != MisfirePolicy():
        options["misfire"] = misfire
    if args.overlap is not None:
        options["overlap"] = OverlapPolicy(args.overlap)
    if args.delivery is not None:
        options["delivery"] = Delivery(args.delivery)
    if args.timeout is not None:
        options["timeout"] = timedelta(seconds=args.timeout)
    if args.lease_ttl is not None:
        options["lease_ttl"] = timedelta(seconds=args.lease_ttl)
    spec = JobSpec(
        # Checked here with a placeholder when no --tenant is given: the client sends the spec
        # without one, and the node puts the token's tenant (or the default) in.
        tenant=args.tenant or DEFAULT_TENANT,
        name=args.name,
        job_type=args.job_type,
        schedule=schedule_from_flags(args),
        payload=_payload(args) or b"",
        priority=args.priority,
        concurrency_key=args.concurrency_key,
        concurrency_limit=args.concurrency_limit,
        **options,
    )
    return validate_spec(spec)


def _rezoned_or_reanchored(schedule: Schedule, args: argparse.Namespace) -> Schedule:
    """The job's own schedule with only its zone (a cron job) or its anchor (an interval job) changed."""
    if args.tz is not None:
        zone(args.tz)  # names an unknown zone before anything else
        if schedule.kind is not ScheduleKind.CRON or args.anchor is not None:
            raise UsageError("--tz alone changes the zone of a cron job's schedule; with another schedule, give "
                             "--cron too")
        return replace(schedule, timezone=args.tz)
    if schedule.kind is not ScheduleKind.INTERVAL:
        raise UsageError("--anchor alone moves an interval job's instants; with another schedule, give --every too")
    return replace(schedule, anchor=instant_flag(args.anchor, "--anchor"))


def updated_spec(spec: JobSpec, args: argparse.Namespace) -> JobSpec:
    """``spec`` with the parts the update flags give replaced, validated."""
    changes: dict[str, Any] = {}
    if any(getattr(args, kind, None) not in (None, False) for kind in ("now", "at", "cron", "every")):
        changes["schedule"] = schedule_from_flags(args)
        if args.jitter is None and not changes["schedule"].is_one_shot:  # a new recurrence keeps the jitter
            changes["schedule"] = replace(changes["schedule"], jitter=spec.schedule.jitter)
    elif args.tz is not None or args.anchor is not None:
        changes["schedule"] = _rezoned_or_reanchored(spec.schedule, args)
    if args.jitter is not None and not any(getattr(args, kind, None) for kind in ("cron", "every")):
        schedule = changes.get("schedule", spec.schedule)
        if schedule.is_one_shot:
            raise UsageError("--jitter only goes with a cron or interval schedule; this job fires once")
        changes["schedule"] = replace(schedule, jitter=timedelta(seconds=args.jitter) if args.jitter else None)
    plain = {"job_type": args.job_type, "priority": args.priority, "concurrency_key": args.concurrency_key,
             "concurrency_limit": args.concurrency_limit, "overlap": args.overlap and OverlapPolicy(args.overlap),
             "delivery": args.delivery and Delivery(args.delivery),
             "timeout": None if args.timeout is None else timedelta(seconds=args.timeout),
             "lease_ttl": None if args.lease_ttl is None else timedelta(seconds=args.lease_ttl)}
    changes.update({name: value for name, value in plain.items() if value is not None})
    if (payload := _payload(args)) is not None:
        changes["payload"] = payload
    retry = _replaced(spec.retry, max_attempts=args.max_attempts,
                      max_retry_time=_seconds(args.max_retry_time), backoff_base=_seconds(args.backoff_base),
                      backoff_cap=_seconds(args.backoff_cap))
    misfire = _replaced(spec.misfire, kind=args.misfire and MisfireKind(args.misfire),
                        grace=_seconds(args.misfire_grace), fire_all_cap=args.fire_all_cap)
    if retry != spec.retry:
        changes["retry"] = retry
    if misfire != spec.misfire:
        changes["misfire"] = misfire
    return validate_spec(replace(spec, **changes))


def _replaced(policy: Any, **fields: Any) -> Any:
    given = {name: value for name, value in fields.items() if value is not None}
    return replace(policy, **given) if given else policy


def _seconds(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


def _payload(args: argparse.Namespace) -> bytes | None:
    return json_document(args.payload, args.payload_file, flag="--payload", file_flag="--payload-file")
