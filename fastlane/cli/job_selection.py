"""``jobs pause``/``jobs resume``/``jobs delete`` over a selection (``--type``, ``--state``)
instead of one job, driven as :mod:`.bulk` drives a bulk action."""

from __future__ import annotations

import argparse

from fastlane.cli.arguments import UsageError
from fastlane.cli.bulk import Words, act_in_calls, add_action_flags
from fastlane.client import Client
from fastlane.domain.lifecycle import JOBS_TAKEN_BY
from fastlane.domain.models import JobState
from fastlane.domain.records import BulkOutcome, JobAction, JobFilter

BULK_ACTIONS = frozenset(action.value for action in JobAction)  # the `jobs` verbs that take a selection
SELECTION_FLAGS = ("job_type", "states")
WORDS = {JobAction.PAUSE: Words("jobs", "pause", "paused", JobAction.PAUSE.value),
         JobAction.RESUME: Words("jobs", "resume", "resumed", JobAction.RESUME.value),
         JobAction.DELETE: Words("jobs", "delete", "deleted", JobAction.DELETE.value)}


def add_bulk_flags(parser: argparse.ArgumentParser, action: JobAction) -> None:
    """``--type``, ``--state`` (repeatable, among the states ``action`` takes), and the bulk flags."""
    takes = sorted(state.value for state in JOBS_TAKEN_BY[action])
    parser.add_argument("--type", dest="job_type", metavar="TYPE", help="instead of JOB: every job of this job type")
    parser.add_argument("--state", dest="states", metavar="STATE", action="append", choices=takes,
                        help=f"instead of JOB, or with --type: only jobs in this state; repeat for several "
                             f"({', '.join(takes)})")
    add_action_flags(parser, WORDS[action])


def one_job_or_a_selection(args: argparse.Namespace) -> bool:
    """True for a selection; refuses both, or neither."""
    chosen = any(getattr(args, name, None) for name in SELECTION_FLAGS)
    if args.job_id and chosen:
        raise UsageError("give a JOB or a selection (--type, --state), not both")
    if not args.job_id and not chosen:
        raise UsageError("give a JOB, or select jobs with --type or --state")
    if args.job_id and (args.dry_run or args.yes or args.limit is not None):
        raise UsageError("--dry-run, --yes and --limit go with a selection, not a JOB")
    return chosen


async def act_on_selection(client: Client, args: argparse.Namespace) -> int:
    """Pause, resume or delete every job the flags select."""
    action = JobAction(args.action)
    selection = JobFilter(job_type=args.job_type or None, states=frozenset(JobState(state) for state in args.states or ()))

    async def call(dry_run: bool, limit: int, page_token: str) -> BulkOutcome:
        return await client.act_on_jobs(action, selection, dry_run=dry_run, limit=limit, page_token=page_token,
                                        reason=getattr(args, "reason", ""))

    return await act_in_calls(call, WORDS[action], args)
