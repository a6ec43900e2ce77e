"""Selecting runs on the command line, and ``runs cancel``/``runs retry`` over a selection.

``runs list`` filters with the same flags. A bulk action counts first: without ``--yes`` it says
how many runs it would take and changes nothing (exit 1, so a script that forgot the flag does
not read success); with ``--yes`` it calls the node until the selection is done, a bounded number
of runs per call, and says how far it has got after each.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from fastlane.cli.arguments import UsageError, duration_seconds, positive_int
from fastlane.cli.lookup import resolve_job
from fastlane.cli.output import note, print_json
from fastlane.client import Client
from fastlane.domain.models import RunState
from fastlane.domain.records import BulkOutcome, RunAction, RunFilter
from fastlane.domain.schedules import parse_at
from fastlane.errors import ScheduleError

SELECTION_FLAGS = ("job_id", "job_type", "states", "since", "until")
MAX_CALL_LIMIT = 1_000  # runs a call takes when --limit is near (the node's own default otherwise)
# What each action says it did, and what it takes when no --state narrows it.
_DONE = {RunAction.CANCEL: "cancelled", RunAction.RETRY: "scheduled again"}
_VERB = {RunAction.CANCEL: "cancel", RunAction.RETRY: "retry"}


def when(text: str) -> datetime:
    """An argparse type: an RFC 3339 instant, or a duration before now (``2h``: two hours ago)."""
    try:
        return datetime.now(UTC) - timedelta(seconds=duration_seconds(text))
    except (ValueError, OverflowError):
        pass
    try:
        return parse_at(text)
    except ScheduleError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an RFC 3339 instant (e.g. 2027-03-14T07:00:00Z) nor a "
                                         "duration ago (2h, 30m, 1d)") from None


def add_selection_flags(parser: argparse.ArgumentParser, *, types: bool = True) -> None:
    """``--job``, ``--type``, ``--state`` (repeatable), ``--since`` and ``--until``."""
    parser.add_argument("--job", dest="job_id", metavar="JOB", help="only runs of this job (its id or name)")
    if types:
        parser.add_argument("--type", dest="job_type", metavar="TYPE", help="only runs of jobs of this job type")
    parser.add_argument(
        "--state", dest="states", metavar="STATE", action="append", choices=[state.value for state in RunState],
        help=f"only runs in this state; repeat for several ({', '.join(state.value for state in RunState)})",
    )
    parser.add_argument("--since", metavar="WHEN", type=when,
                        help="only runs scheduled at or after WHEN: an RFC 3339 instant, or a duration ago (2h, 30m, 1d)")
    parser.add_argument("--until", metavar="WHEN", type=when,
                        help="only runs scheduled before WHEN (an instant, or a duration ago, as --since)")


def add_bulk_flags(parser: argparse.ArgumentParser, action: RunAction) -> None:
    """The selection flags, and those of a bulk action: ``--dry-run``, ``--yes``, ``--limit``."""
    add_selection_flags(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help=f"with a selection: count the runs it would {_VERB[action]}, change nothing")
    parser.add_argument("--yes", action="store_true",
                        help=f"with a selection: {_VERB[action]} them (without it, the count is shown and nothing changes)")
    parser.add_argument("--limit", metavar="N", type=positive_int,
                        help="with a selection: stop after this many runs (default: every run of the selection)")


def selected(args: argparse.Namespace) -> bool:
    """Whether any selection flag was given."""
    return any(getattr(args, name, None) for name in SELECTION_FLAGS)


def check_selection(args: argparse.Namespace) -> None:
    """Refuse, before reaching a node, flags that cannot go together."""
    if args.since is not None and args.until is not None and args.until <= args.since:
        raise UsageError("--until must be later than --since")


async def selection_of(client: Client, args: argparse.Namespace) -> RunFilter:
    """The selection the flags give (a job's name resolved to its id)."""
    job_id = (await resolve_job(client, args.job_id)).job_id if args.job_id else None
    return RunFilter(job_id=job_id, job_type=getattr(args, "job_type", None) or None,
                     states=frozenset(RunState(state) for state in args.states or ()),
                     scheduled_from=args.since, scheduled_before=args.until)


async def act_on_selection(client: Client, args: argparse.Namespace, action: RunAction) -> int:
    """``runs cancel``/``runs retry`` with a selection instead of a run id."""
    selection = await selection_of(client, args)
    if args.dry_run or not args.yes:
        counted = await client.act_on_runs(action, selection, dry_run=True)
        if args.json:
            print_json({"action": action.value, "dry_run": True, "matched": counted.matched})
        else:
            print(f"{counted.matched:,} runs would be {_DONE[action]}")
        if not args.dry_run and counted.matched:
            note(f"nothing changed: add --yes to {_VERB[action]} them")
            return 1
        return 0
    total, token = BulkOutcome(matched=0), ""
    while True:
        left = None if args.limit is None else args.limit - total.matched
        outcome = await client.act_on_runs(action, selection, page_token=token,
                                           limit=0 if left is None else min(left, MAX_CALL_LIMIT))
        total, token = _add(total, outcome), outcome.next_page_token
        if not token or outcome.stopped_because or (args.limit is not None and total.matched >= args.limit):
            return _report(action, total, args)
        if not args.json:
            note(f"{total.acted:,} runs {_DONE[action]} so far ({total.skipped:,} skipped)…")


def _add(total: BulkOutcome, outcome: BulkOutcome) -> BulkOutcome:
    return BulkOutcome(matched=total.matched + outcome.matched, acted=total.acted + outcome.acted,
                       skipped=total.skipped + outcome.skipped, next_page_token=outcome.next_page_token,
                       stopped_because=outcome.stopped_because)


def _report(action: RunAction, total: BulkOutcome, args: argparse.Namespace) -> int:
    stopped = total.stopped_because
    if args.json:
        document: dict[str, Any] = {"action": action.value, "dry_run": False, "matched": total.matched,
                                    "acted": total.acted, "skipped": total.skipped, "stopped_because": stopped or None}
        print_json(document)
    else:
        skipped = f" ({total.skipped:,} skipped: they had changed meanwhile)" if total.skipped else ""
        print(f"{total.acted:,} runs {_DONE[action]}{skipped}")
        if stopped:
            note(f"stopped before the end of the selection: {stopped}; run the command again to go on")
    return 1 if stopped else 0
