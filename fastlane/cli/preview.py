"""``fastlane jobs preview``: a schedule's fire times, computed here exactly as a node computes
them (no daemon needed): the next ones, or those of a range (what a backfill of it would run),
with what daylight saving did to them and, with a jitter, when their runs start."""

from __future__ import annotations

import argparse
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from fastlane.cli.arguments import add_schedule_flags, instant_flag, json_flag, positive_int, schedule_from_flags
from fastlane.cli.output import note, print_json, print_table
from fastlane.domain import validation
from fastlane.domain.backfill import count_fire_times
from fastlane.domain.jitter import run_instant
from fastlane.domain.limits import MAX_PREVIEW
from fastlane.domain.models import Schedule, ScheduleKind
from fastlane.domain.schedules import fire_notes, local_time, next_fire_after, preview
from fastlane.errors import InvalidArgument
from fastlane.rpc.wire import rfc3339

MAX_COUNTED = 100_000  # fire times a range is counted up to (--until): a second or so of cron arithmetic


def add_preview_parser(actions: Any) -> None:
    parser = actions.add_parser(
        "preview",
        help="show the next fire times of a schedule (computed locally, no daemon needed)",
        description="Show the next fire times of a schedule in UTC and local time, without creating anything; "
                    "with --until, those of a range (what `jobs backfill` would run), and how many it holds.",
    )
    add_schedule_flags(
        parser,
        allow_now=False,
        tz_help="IANA time zone: of the --cron expression, and of the local column (default: UTC)",
        anchor_default="the --after instant",
    )
    parser.add_argument("--after", metavar="RFC3339", help="list times strictly after this instant (default: now)")
    parser.add_argument("--until", metavar="RFC3339",
                        help="only times before this instant, and say how many the range holds")
    parser.add_argument("--job-id", metavar="ID",
                        help="with --jitter: the job whose runs' instants to show (its offsets are its own), "
                             "as `jobs get` shows its id")
    parser.add_argument("--count", metavar="N", type=positive_int, default=5,
                        help=f"how many fire times to show, at most {MAX_PREVIEW} (default: 5)")
    json_flag(parser)
    parser.set_defaults(handler=preview_schedule, command_parser=parser)


def preview_schedule(args: argparse.Namespace) -> int:
    """Fire times, computed here with :mod:`fastlane.domain.schedules` exactly as a node would."""
    schedule = schedule_from_flags(args, tz_is_display_only=True)
    if args.count > MAX_PREVIEW:
        raise InvalidArgument("--count", f"{args.count} is over the limit of {MAX_PREVIEW}")
    if args.job_id is not None:
        validation.identifier("--job-id", args.job_id)
        if schedule.jitter is None:
            raise InvalidArgument("--job-id", "shows a job's jittered instants: give --jitter too")
    after = instant_flag(args.after, "--after") if args.after is not None else datetime.now(UTC)
    until = instant_flag(args.until, "--until") if args.until is not None else None
    if until is not None and until <= after:
        raise InvalidArgument("--until", "must be later than --after")
    if schedule.kind is ScheduleKind.INTERVAL and schedule.anchor is None:
        schedule = replace(schedule, anchor=after)  # as preview() counts it
    display_zone = args.tz or "UTC"
    instants = [t for t in preview(schedule, after, args.count) if until is None or t < until]
    notes = fire_notes(schedule, instants, after)
    rows = [_row(schedule, utc, display_zone, why, args.job_id) for utc, why in zip(instants, notes, strict=True)]
    total = None if until is None else count_fire_times(schedule, after + timedelta(microseconds=1), until, MAX_COUNTED)
    if args.json:
        print_json(rows if until is None else {"fire_times": rows, "in_range": total, "counted_up_to": MAX_COUNTED})
        return 0
    _print(rows, display_zone, schedule.jitter is not None)
    if total is not None:
        shown = f"{total:,}" if total < MAX_COUNTED else f"{MAX_COUNTED:,} or more"
        note(f"({shown} fire times in ({rfc3339(after)}, {rfc3339(until)}); {len(rows)} shown)")
    elif not rows:
        note(f"(this schedule fires no more times after {rfc3339(after)})")
    if schedule.jitter is not None and args.job_id is None:
        note("(each run starts at an offset fixed per job and fire time, before STARTS_BY; --job-id shows a job's own)")
    return 0


def _row(schedule: Schedule, utc: datetime, zone_name: str, why: str | None, job_id: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"utc": rfc3339(utc), "local": local_time(utc, zone_name).isoformat(), "note": why}
    if schedule.jitter is not None:
        if job_id is not None:
            row["run_at"] = rfc3339(run_instant(job_id, schedule, utc))
        else:  # the latest offset: the span jitter_offset draws from
            following = next_fire_after(schedule, utc)
            span = schedule.jitter if following is None else min(schedule.jitter, following - utc)
            row["starts_by"] = rfc3339(utc + span)
    return row


def _print(rows: list[dict[str, Any]], zone_name: str, jittered: bool) -> None:
    headers = ["UTC", f"LOCAL ({zone_name})"]
    keys = ["utc", "local"]
    if jittered:
        extra = "run_at" if rows and "run_at" in rows[0] else "starts_by"
        headers.append(extra.upper())
        keys.append(extra)
    if any(row["note"] for row in rows):  # a daylight saving transition moved, repeated or skipped something
        headers.append("NOTE")
        keys.append("note")
    print_table(headers, [[row[key] or "" for key in keys] for row in rows])
