"""``fastlane jobs backfill``: run a recurring job's fire times over a past range now.

The range is walked a bounded part per call (``--batch`` fire times), each part's progress printed
as it is written; ``--dry-run`` walks it the same way and writes nothing. The backfill's id names
its runs: ``runs list --backfill ID`` shows them, ``runs cancel --backfill ID`` cancels those not
started yet.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from fastlane.cli.arguments import json_flag, positive_int
from fastlane.cli.lookup import resolve_job
from fastlane.cli.output import note, print_json
from fastlane.cli.remote import run_remote
from fastlane.cli.run_selection import when
from fastlane.client import Client
from fastlane.domain.backfill import BACKFILL_OVERLAPS, DEFAULT_BACKFILL_BATCH, MAX_BACKFILL_BATCH, BackfillMode
from fastlane.rpc.wire import rfc3339


def add_backfill_parser(actions: Any, remote: argparse.ArgumentParser) -> None:
    parser = actions.add_parser(
        "backfill", parents=[remote], help="run a cron or interval job's fire times over a past range, now",
        description="Run a cron or interval job's fire times in [--from, --until) now: by default those that have "
                    "no run that ran (none was written, or it was skipped), with --all every one. Each gets a run "
                    "at the instant a run for it has (its jitter included), one at a time oldest first "
                    "(--overlap buffer_all) or all at once (--overlap allow). Fire times after now, or at or after "
                    "the job's next one, are left to its schedule. The backfill's id names its runs: "
                    "`fastlane runs list --backfill ID` shows its progress, `fastlane runs cancel --backfill ID "
                    "--yes` cancels the runs not started yet.",
    )
    parser.add_argument("job_id", metavar="JOB", help="id or name of the job, or a unique start of its id")
    parser.add_argument("--from", dest="start", metavar="WHEN", type=when, required=True,
                        help="the range's first instant: RFC 3339, or a duration ago (2d: two days ago)")
    parser.add_argument("--until", dest="end", metavar="WHEN", type=when,
                        help="the range ends before this instant (RFC 3339, or a duration ago; default: now)")
    parser.add_argument("--all", action="store_true",
                        help="every fire time of the range, also those that have a run already (default: the missed ones)")
    parser.add_argument("--overlap", choices=[policy.value for policy in BACKFILL_OVERLAPS],
                        default=BACKFILL_OVERLAPS[0].value,
                        help="buffer_all: one run at a time, oldest first, each once the job has no other run "
                             "going; allow: all free to start at once (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="count the runs it would write; write nothing")
    parser.add_argument("--batch", metavar="N", type=positive_int, default=DEFAULT_BACKFILL_BATCH,
                        help=f"fire times per call, at most {MAX_BACKFILL_BATCH:,} (default: {DEFAULT_BACKFILL_BATCH:,})")
    json_flag(parser)
    parser.set_defaults(handler=backfill_job, command_parser=parser)


def backfill_job(args: argparse.Namespace) -> int:
    end = args.end or datetime.now(UTC)
    so_far = {"written": 0, "backfill_id": ""}  # for a Ctrl-C: what the parts done wrote

    async def backfill(client: Client) -> int:
        job = await resolve_job(client, args.job_id)
        written = already = matched = 0
        backfill_id = ""
        async for part in client.backfill_all(
            job.job_id, args.start, end, mode=BackfillMode.ALL if args.all else BackfillMode.MISSED,
            overlap=args.overlap, dry_run=args.dry_run, limit=args.batch,
        ):
            backfill_id, written, already, matched = (part.backfill_id, written + part.written,
                                                      already + part.already_run, matched + part.matched)
            so_far.update(written=written, backfill_id=backfill_id)
            if part.next_page_token and not args.json:
                done = _share(args.start, part.covered_until, end)
                # Done: the fire times before covered_until, so through the last one, a microsecond before.
                through = rfc3339(part.covered_until - timedelta(microseconds=1))
                note(f"{written:,} runs {'to write' if args.dry_run else 'written'} so far, fire times through "
                     f"{through} ({done:.0%} of the range)…")
        if args.json:
            print_json({"backfill_id": None if args.dry_run else backfill_id, "job_id": job.job_id,
                        "dry_run": args.dry_run, "fire_times": matched, "written": written, "already_run": already})
            return 0
        verb = "would be written" if args.dry_run else "written"
        print(f"{matched:,} fire times of job {job.name} in [{rfc3339(args.start)}, {rfc3339(end)}): "
              f"{written:,} runs {verb}" + (f", {already:,} had a run already" if already else ""))
        if not args.dry_run and written:
            print(f"backfill {backfill_id}")
            note(f"progress: fastlane runs list --backfill {backfill_id}; "
                 f"stop it: fastlane runs cancel --backfill {backfill_id} --yes")
        return 0

    try:
        return run_remote(args, backfill)
    except KeyboardInterrupt:  # the parts written stay: a backfill of the missed ones goes on from them
        if so_far["written"] and not args.dry_run:
            note(f"stopped: backfill {so_far['backfill_id']} wrote {so_far['written']:,} runs; run the command again "
                 "(without --all) to write the rest, or cancel them with "
                 f"`fastlane runs cancel --backfill {so_far['backfill_id']} --yes`")
        return 130


def _share(start: datetime, reached: datetime, end: datetime) -> float:
    span = (end - start).total_seconds()
    return 1.0 if span <= 0 else min(max((reached - start).total_seconds() / span, 0.0), 1.0)
