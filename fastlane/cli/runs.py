"""``fastlane runs …``: what fired, when, where, and how it ended."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import orjson

from fastlane.cli.arguments import UsageError, client_flags, json_flag, positive_int, positive_seconds
from fastlane.cli.lookup import resolve_job, resolve_run
from fastlane.cli.output import cell, note, print_fields, print_json, print_table
from fastlane.cli.remote import collect_pages, run_remote
from fastlane.cli.run_selection import (
    act_on_selection,
    add_bulk_flags,
    add_selection_flags,
    check_selection,
    selected,
    selection_of,
)
from fastlane.cli.views import (
    attempt_note,
    attempt_view,
    audit_view,
    fetch_history,
    print_history,
    print_tracebacks,
    run_duration,
    run_fields,
    run_io_fields,
    run_io_view,
    run_lag,
    run_view,
)
from fastlane.client import Client
from fastlane.domain.audit import AuditTarget
from fastlane.domain.lifecycle import cancel_in_effect
from fastlane.domain.models import Run, RunState
from fastlane.domain.records import RunAction
from fastlane.errors import RemoteNotFound

# Long error texts would stretch every row of the table; `runs get` shows them whole.
TABLE_ERROR_WIDTH = 60


def register(commands: Any) -> None:
    """Add ``runs`` and its subcommands to the top-level subparsers."""
    remote = client_flags()
    runs = commands.add_parser("runs", help="inspect run history", description="Inspect run history.")
    actions = runs.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser(
        "list", parents=[remote], help="list runs, newest first", description="List runs, newest scheduled time first."
    )
    add_selection_flags(listing)
    listing.add_argument(
        "--limit", metavar="N", type=positive_int, default=100, help="show at most this many runs (default: 100)"
    )
    json_flag(listing)
    listing.set_defaults(handler=list_runs, command_parser=listing)

    tail = actions.add_parser(
        "tail", parents=[remote], help="follow runs live as they are made and change state",
        description="Print the latest runs, then each run again as it is made or changes state (or progress), "
        "until Ctrl-C or --for SECONDS. Rows as in `runs list`.",
    )
    tail.add_argument("--job", dest="job_id", metavar="JOB", help="only runs of this job (its id or name)")
    tail.add_argument("--interval", metavar="SECONDS", type=positive_seconds, default=1.0,
                      help="how often to ask the node (default: 1)")
    tail.add_argument("--for", dest="duration", metavar="SECONDS", type=positive_seconds,
                      help="stop after this long (default: until Ctrl-C)")
    tail.add_argument("--json", action="store_true",
                      help="print each run as one JSON object a line (as `runs list --json` shows a run, with "
                           "its job's name), for scripts")
    tail.set_defaults(handler=tail_runs, command_parser=tail)

    get = actions.add_parser(
        "get", parents=[remote], help="show one run, its attempts and its history",
        description="Show one run, its attempts and its history (who triggered, cancelled or retried it, and when)."
    )
    get.add_argument("run_id", metavar="RUN_ID", help="id of the run, or a unique start of it (4 characters or more)")
    get.add_argument("--all-tracebacks", action="store_true",
                     help="print the traceback of every attempt that raised (default: the last one only)")
    json_flag(get)
    get.set_defaults(handler=get_run, command_parser=get)

    cancel = actions.add_parser(
        "cancel", parents=[remote], help="cancel a run, or every run a selection takes",
        description="Cancel a run: a queued run never starts; a running handler is cancelled and the run ends "
        "cancelled. With --job, --type, --state, --since or --until instead of RUN_ID: every run not yet ended that "
        "they select, after counting them (--yes to go ahead, --dry-run to count only).",
    )
    cancel.add_argument("run_id", metavar="RUN_ID", nargs="?",
                        help="id of the run, or a unique start of it (4 characters or more)")
    add_bulk_flags(cancel, RunAction.CANCEL)
    json_flag(cancel)
    cancel.set_defaults(handler=cancel_run, command_parser=cancel)

    retry = actions.add_parser(
        "retry", parents=[remote], help="replay a dead or lost run, or every one a selection takes",
        description="Replay a dead or lost run now, as a new attempt with the same idempotency key. With --job, "
        "--type, --state, --since or --until instead of RUN_ID: every dead or lost run they select, after counting "
        "them (--yes to go ahead, --dry-run to count only).",
    )
    retry.add_argument("run_id", metavar="RUN_ID", nargs="?",
                       help="id of the run, or a unique start of it (4 characters or more)")
    add_bulk_flags(retry, RunAction.RETRY)
    json_flag(retry)
    retry.set_defaults(handler=retry_run, command_parser=retry)


def _shorten(text: str | None, width: int) -> str | None:
    if text is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"


# LAG: the first attempt's start (its handler entered) after the scheduled time, as the job saw it.
RUN_COLUMNS = ("RUN_ID", "JOB", "STATE", "SCHEDULED_FOR", "LAG", "DURATION", "ATTEMPTS", "PROGRESS", "LAST_ERROR")


def _run_row(run: Run, job_names: dict[str, str]) -> tuple[Any, ...]:
    return (
        run.run_id,
        job_names.get(run.job_id, run.job_id),
        run.state.value,
        run.scheduled_for,
        _short_duration(run_lag(run)),
        _short_duration(run_duration(run)),
        run.attempts,
        f"{run.progress * 100:.0f}%" if run.progress else None,
        _shorten(run.last_error, TABLE_ERROR_WIDTH),
    )


def _short_duration(value: timedelta | None) -> str | None:
    """``12.3 ms``, ``4.56 s``, ``2.0 min``, ``3.5 h``: a person's reading of a lag or a duration."""
    if value is None:
        return None
    seconds = value.total_seconds()
    if abs(seconds) < 1:
        return f"{seconds * 1000:.1f} ms"
    if abs(seconds) < 60:
        return f"{seconds:.2f} s"
    if abs(seconds) < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


NAMES_ASKED = 50  # jobs whose names a listing asks for, at most; the others show their ids
NAMES_AT_ONCE = 8


async def job_names(client: Client, runs: list[Run]) -> dict[str, str]:
    """The names of the runs' jobs, asked for once per job, a few at a time and for at most
    :data:`NAMES_ASKED` jobs (a job deleted meanwhile, or beyond that, shows its id)."""
    asking = asyncio.Semaphore(NAMES_AT_ONCE)

    async def name_of(job_id: str) -> tuple[str, str]:
        async with asking:
            try:
                return job_id, (await client.get_job(job_id)).name
            except RemoteNotFound:
                return job_id, job_id
    job_ids = list(dict.fromkeys(run.job_id for run in runs))[:NAMES_ASKED]
    return dict(await asyncio.gather(*(name_of(job_id) for job_id in job_ids)))


def list_runs(args: argparse.Namespace) -> int:
    check_selection(args)

    async def collect(client: Client) -> int:
        selection = await selection_of(client, args)
        runs, more = await collect_pages(
            lambda size, token: client.list_runs(
                job_id=selection.job_id, job_type=selection.job_type, states=selection.states, page_size=size,
                page_token=token, scheduled_from=selection.scheduled_from, scheduled_before=selection.scheduled_before,
                backfill_id=selection.backfill_id,
            ),
            args.limit,
        )
        if args.json:
            print_json([run_view(run) for run in runs])
            return 0
        names = await job_names(client, runs)
        print_table(RUN_COLUMNS, [_run_row(run, names) for run in runs])
        if more:
            note(f"(showing the newest {args.limit} runs; raise --limit to see more)")
        return 0

    return run_remote(args, collect)


TAIL_FIRST = 10  # runs shown when tail starts; after that, every run that is new or changed
TAIL_PAGE = 200  # the newest runs looked at on each poll


def tail_runs(args: argparse.Namespace) -> int:
    async def follow(client: Client) -> int:
        if args.job_id:
            args.job_id = (await resolve_job(client, args.job_id)).job_id
        loop = asyncio.get_running_loop()
        stop_at = None if args.duration is None else loop.time() + args.duration
        shown: dict[str, tuple[str, int, float]] = {}  # run id -> what was printed of it
        names: dict[str, str] = {}
        if not args.json:
            print(tail_line(RUN_COLUMNS), flush=True)
        while True:
            page = await client.list_runs(job_id=args.job_id, page_size=TAIL_PAGE)
            changed = [run for run in reversed(page.items) if shown.get(run.run_id) != _shown_as(run)]
            if not shown:
                for run in changed[:-TAIL_FIRST]:  # older ones count as seen
                    shown[run.run_id] = _shown_as(run)
                changed = changed[-TAIL_FIRST:]
            if unknown := [run for run in changed if run.job_id not in names]:
                names.update(await job_names(client, unknown))
            for run in changed:
                shown[run.run_id] = _shown_as(run)
                if args.json:
                    print(orjson.dumps({**run_view(run), "job_name": names.get(run.job_id)}).decode(), flush=True)
                else:
                    print(tail_line([cell(value) for value in _run_row(run, names)]), flush=True)
            # Forget runs older than the page: runs are listed newest first, so they never return.
            on_page = {run.run_id for run in page.items}
            shown = {run_id: mark for run_id, mark in shown.items() if run_id in on_page} or shown
            left = None if stop_at is None else stop_at - loop.time()
            if left is not None and left <= 0:
                return 0
            await asyncio.sleep(args.interval if left is None else min(args.interval, left))

    try:
        return run_remote(args, follow)
    except KeyboardInterrupt:  # Ctrl-C is how one stops following
        return 0


# The widths of ``runs tail``'s columns: rows come one at a time, so they cannot be measured as a
# table's are. A longer cell (a long job name) is cut to its column's width with "…", so every row
# stays aligned (--json has it whole); the last column, the error, is never padded.
TAIL_WIDTHS = (36, 20, 10, 27, 9, 9, 8, 8)


def tail_line(cells: Sequence[str]) -> str:
    padded = [(_shorten(text, width) or "").ljust(width) for text, width in zip(cells, TAIL_WIDTHS, strict=False)]
    return "  ".join([*padded, *cells[len(TAIL_WIDTHS):]]).rstrip()


def _shown_as(run: Run) -> tuple[str, int, float]:
    return run.state.value, run.attempts, run.progress


def get_run(args: argparse.Namespace) -> int:
    async def show(client: Client) -> int:
        run, attempts = await client.get_run(await resolve_run(client, args.run_id))
        history = await fetch_history(client, AuditTarget.RUN, run.run_id)
        if args.json:
            print_json({**run_view(run), **run_io_view(run), "attempts": [attempt_view(attempt) for attempt in attempts],
                        "history": None if history is None else [audit_view(event) for event in history]})
            return 0
        print_fields(run_fields(run) + run_io_fields(run))
        if attempts:
            print()
            print_table(
                (
                    "ATTEMPT",
                    "WORKER",
                    "NODE",
                    "OUTCOME",
                    "NOTE",
                    "DISPATCHED_AT",
                    "STARTED_AT",
                    "FINISHED_AT",
                    "ERROR_CODE",
                    "ERROR_MESSAGE",
                ),
                [
                    (
                        attempt.attempt,
                        attempt.worker_id,
                        attempt.node_id,
                        attempt.outcome.value,
                        attempt_note(attempt),
                        attempt.dispatched_at,
                        attempt.started_at,
                        attempt.finished_at,
                        attempt.error_code,
                        attempt.error_message,
                    )
                    for attempt in attempts
                ],
            )
            print_tracebacks(attempts, every=args.all_tracebacks)
        print_history(history, targets=False)
        return 0

    return run_remote(args, show)


def _one_run_or_a_selection(args: argparse.Namespace) -> bool:
    """True for a selection; refuses both, or neither."""
    if args.run_id and selected(args):
        raise UsageError("give a RUN_ID or a selection (--job, --type, --state, --since, --until), not both")
    if not args.run_id and not selected(args):
        raise UsageError("give a RUN_ID, or select runs with --job, --type, --state, --since or --until")
    if args.run_id and (args.dry_run or args.yes or args.limit is not None):
        raise UsageError("--dry-run, --yes and --limit go with a selection, not a RUN_ID")
    check_selection(args)
    return not args.run_id


def cancel_run(args: argparse.Namespace) -> int:
    if _one_run_or_a_selection(args):
        return run_remote(args, lambda client: act_on_selection(client, args, RunAction.CANCEL))

    async def cancel(client: Client) -> int:
        run, _ = await client.get_run(await resolve_run(client, args.run_id))
        if cancel_in_effect(run):
            if args.json:
                print_json(run_view(run))
            else:  # a repeated verb succeeds, and says so
                print(f"run {run.run_id} is already {'cancelled' if run.state is RunState.CANCELLED else 'being cancelled'}"
                      "; nothing changed")
            return 0
        run = await client.cancel_run(run.run_id)
        if args.json:
            print_json(run_view(run))
        elif run.state is RunState.CANCELLED:
            print(f"run {run.run_id} cancelled")
        else:
            print(f"run {run.run_id} is {run.state.value}: its worker has been told to stop")
        return 0

    return run_remote(args, cancel)


def retry_run(args: argparse.Namespace) -> int:
    if _one_run_or_a_selection(args):
        return run_remote(args, lambda client: act_on_selection(client, args, RunAction.RETRY))

    async def retry(client: Client) -> int:
        run = await client.retry_run(await resolve_run(client, args.run_id))
        if args.json:
            print_json(run_view(run))
        else:
            print(f"run {run.run_id} scheduled again (attempt {run.attempts + 1}, key {run.idempotency_key})")
        return 0

    return run_remote(args, retry)
