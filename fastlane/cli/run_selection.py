"""Selecting runs on the command line, and ``runs cancel``/``runs retry`` over a selection.

``runs list`` filters with the same flags; a bulk action is driven as :mod:`.bulk` drives them.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from fastlane.cli.arguments import UsageError, duration_seconds
from fastlane.cli.bulk import Words, act_in_calls, add_action_flags
from fastlane.cli.lookup import resolve_job
from fastlane.client import Client
from fastlane.domain.models import RunState
from fastlane.domain.records import BulkOutcome, RunAction, RunFilter
from fastlane.domain.schedules import parse_at
from fastlane.errors import ScheduleError

SELECTION_FLAGS = ("job_id", "job_type", "states", "since", "until", "backfill_id")
_WORDS = {RunAction.CANCEL: Words("runs", "cancel", "cancelled", RunAction.CANCEL.value),
          RunAction.RETRY: Words("runs", "retry", "scheduled again", RunAction.RETRY.value)}


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
    parser.add_argument("--backfill", dest="backfill_id", metavar="ID",
                        help="only the runs of this backfill (the id `fastlane jobs backfill` prints)")


def add_bulk_flags(parser: argparse.ArgumentParser, action: RunAction) -> None:
    """The selection flags, and those of a bulk action: ``--dry-run``, ``--yes``, ``--limit``."""
    add_selection_flags(parser)
    add_action_flags(parser, _WORDS[action])


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
                     scheduled_from=args.since, scheduled_before=args.until,
                     backfill_id=getattr(args, "backfill_id", None) or None)


async def act_on_selection(client: Client, args: argparse.Namespace, action: RunAction) -> int:
    """``runs cancel``/``runs retry`` with a selection instead of a run id."""
    selection = await selection_of(client, args)

    async def call(dry_run: bool, limit: int, page_token: str) -> BulkOutcome:
        return await client.act_on_runs(action, selection, dry_run=dry_run, limit=limit, page_token=page_token)

    return await act_in_calls(call, _WORDS[action], args)
