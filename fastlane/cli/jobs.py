"""``fastlane jobs …``: create, inspect, pause, resume, delete and trigger jobs; preview schedules."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from fastlane.cli.arguments import (
    UsageError,
    add_json_flags,
    add_schedule_flags,
    client_flags,
    json_flag,
    positive_int,
    positive_seconds,
    schedule_from_flags,
)
from fastlane.cli.backfill import add_backfill_parser
from fastlane.cli.job_selection import BULK_ACTIONS, act_on_selection, add_bulk_flags, one_job_or_a_selection
from fastlane.cli.job_specs import spec_from_flags, updated_spec
from fastlane.cli.lookup import resolve_job
from fastlane.cli.output import note, print_fields, print_json, print_table
from fastlane.cli.preview import add_preview_parser
from fastlane.cli.remote import collect_pages, run_remote
from fastlane.cli.views import (
    audit_view,
    describe_schedule,
    fetch_history,
    job_fields,
    job_view,
    print_history,
    run_view,
    state_shown,
)
from fastlane.client import Client
from fastlane.domain.audit import AuditTarget
from fastlane.domain.limits import MAX_CONCURRENCY_LIMIT
from fastlane.domain.models import (
    Delivery,
    Job,
    JobState,
    MisfireKind,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
)
from fastlane.domain.records import JobAction
from fastlane.errors import FastlaneError, RemoteError, RemoteNotFound
from fastlane.rpc.wire import rfc3339


def register(commands: Any) -> None:
    """Add ``jobs`` and its subcommands to the top-level subparsers."""
    jobs = commands.add_parser("jobs", help="create and manage jobs", description="Create and manage jobs.")
    actions = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    remote = client_flags()

    create = actions.add_parser(
        "create",
        parents=[remote],
        help="create a job (idempotent on tenant and name)",
        description="Create a job. Creating the same name with the same spec again returns the existing job.",
    )
    create.add_argument("--name", required=True, help="job name, unique within the tenant")
    create.add_argument(
        "--type", dest="job_type", metavar="TYPE", required=True, help="job type; routes runs to workers handling it"
    )
    add_schedule_flags(
        create,
        allow_now=True,
        tz_help="with --cron: IANA time zone, e.g. Europe/Paris (default: UTC)",
        anchor_default="when the job is stored",
    )
    _add_policy_flags(create)
    json_flag(create)
    create.set_defaults(handler=create_job, command_parser=create)

    update = actions.add_parser(
        "update",
        parents=[remote],
        help="change a job: the flags given replace those parts of its spec, the rest stays",
        description="Change a job: each flag given replaces that part of its spec (a schedule flag replaces its "
        "schedule, --max-attempts its retry budget, and so on); what is not given stays as it is. The name and "
        "tenant cannot change. Runs already written keep what they were made with.",
    )
    update.add_argument("job_id", metavar="JOB", help="id or name of the job, or a unique start of its id")
    update.add_argument("--type", dest="job_type", metavar="TYPE", help="job type; routes runs to workers handling it")
    add_schedule_flags(update, allow_now=True,
                       tz_help="IANA time zone: of a new --cron (default: UTC), or alone, the job's cron schedule "
                               "moved to this zone",
                       anchor_default="when the job is updated; alone, the job's interval instants moved to it",
                       required=False)
    _add_policy_flags(update)
    update.set_defaults(priority=None)  # unset: keep the job's (create's default is 0)
    json_flag(update)
    update.set_defaults(handler=update_job, command_parser=update)

    listing = actions.add_parser("list", parents=[remote], help="list jobs", description="List the tenant's jobs.")
    listing.add_argument(
        "--state",
        metavar="STATE",
        choices=[state.value for state in JobState],
        help=f"only jobs in this state ({', '.join(state.value for state in JobState)})",
    )
    listing.add_argument("--type", dest="job_type", metavar="TYPE", help="only jobs of this type")
    names = listing.add_mutually_exclusive_group()
    names.add_argument("--name", metavar="NAME", help="only the job of this name")
    names.add_argument("--name-prefix", metavar="TEXT", help="only jobs whose name starts with TEXT (as the console's search)")
    listing.add_argument(
        "--limit", metavar="N", type=positive_int, default=100, help="show at most this many jobs (default: 100)"
    )
    json_flag(listing)
    listing.set_defaults(handler=list_jobs, command_parser=listing)

    for name, summary in (
        ("get", "show one job and its history (who changed it and its runs, and when)"),
        ("pause", "stop a job firing until it is resumed"),
        ("resume", "resume a paused job (missed times follow its misfire policy)"),
        ("delete", "delete a job (its runs stay in history; queued ones are cancelled)"),
        ("trigger", "run a job once, now, outside its schedule"),
    ):
        bulk = JobAction(name) if name in BULK_ACTIONS else None
        described = summary[0].upper() + summary[1:] + "."
        if bulk is not None:
            summary += ", or every job a selection takes"
            described += (" With --type or --state instead of JOB: every job the selection takes, counted first "
                          "(--dry-run, or without --yes), then a bounded number per call.")
        action = actions.add_parser(name, parents=[remote], help=summary, description=described)
        action.add_argument("job_id", metavar="JOB", nargs="?" if bulk else None,
                            help="id or name of the job, or a unique start of its id")
        if bulk is JobAction.PAUSE:
            action.add_argument("--reason", metavar="TEXT", default="",
                                help="why (at most 200 characters): kept with the job until it is resumed, and in its history")
        if bulk is not None:
            add_bulk_flags(action, bulk)
        json_flag(action)
        action.set_defaults(handler=act_on_job, command_parser=action)

    add_backfill_parser(actions, remote)

    add_preview_parser(actions)


def _add_policy_flags(parser: argparse.ArgumentParser) -> None:
    policies = parser.add_argument_group("payload and policies")
    add_json_flags(policies, "--payload", "the document handed to the worker", '{"id": 7}')
    policies.add_argument(
        "--priority", metavar="N", type=int, default=0,
        help="higher first among the tenant's runs waiting for a worker, -1000..1000; a waiting run gains 20 a "
        "second, so none waits behind newer ones for more than 100 s (default: 0)",
    )
    policies.add_argument(
        "--concurrency-key", metavar="KEY",
        help="runs of every job of the tenant with this key share one cap across the cluster: at most "
        "--concurrency-limit of them dispatched or running at once; the others wait (default: no cap)",
    )
    policies.add_argument(
        "--concurrency-limit", metavar="N", type=positive_int,
        help=f"with --concurrency-key: runs of the key at once, 1..{MAX_CONCURRENCY_LIMIT:,} (default: 1)",
    )
    defaults = RetryPolicy()
    policies.add_argument(
        "--max-attempts",
        metavar="N",
        type=positive_int,
        help=f"attempts before a run is dead (default: {defaults.max_attempts})",
    )
    policies.add_argument(
        "--max-retry-time",
        metavar="SECONDS",
        type=positive_seconds,
        help="no retry starts later than this after the first attempt (default: no limit)",
    )
    policies.add_argument(
        "--backoff-base",
        metavar="SECONDS",
        type=positive_seconds,
        help=f"retry n waits a random time up to base * 2^(n-1) (default: {defaults.backoff_base.total_seconds():g})",
    )
    policies.add_argument(
        "--backoff-cap",
        metavar="SECONDS",
        type=positive_seconds,
        help=f"the longest wait before a retry (default: {defaults.backoff_cap.total_seconds():g})",
    )
    policies.add_argument(
        "--misfire",
        choices=[kind.value for kind in MisfireKind],
        help="what to do with times missed while nothing could fire them (default: fire_once)",
    )
    policies.add_argument(
        "--misfire-grace",
        metavar="SECONDS",
        type=positive_seconds,
        help=f"a time fired later than this counts as missed (default: {MisfirePolicy().grace.total_seconds():g})",
    )
    policies.add_argument(
        "--fire-all-cap",
        metavar="N",
        type=positive_int,
        help=f"with --misfire fire_all: at most this many missed times fire (default: {MisfirePolicy().fire_all_cap})",
    )
    policies.add_argument(
        "--overlap",
        choices=[policy.value for policy in OverlapPolicy],
        help="what to do when a run is due while the previous one is still going (default: allow)",
    )
    policies.add_argument(
        "--delivery", choices=[kind.value for kind in Delivery], help="delivery guarantee (default: at_least_once)"
    )
    policies.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_seconds,
        help="an attempt running longer is timed out (default: none)",
    )
    policies.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        type=positive_seconds,
        help="how long a worker may go without a heartbeat before its attempt is lost (default: 30)",
    )


# -- create ------------------------------------------------------------------------------------


def create_job(args: argparse.Namespace) -> int:
    spec = spec_from_flags(args)  # before connecting: a bad flag never costs a round trip
    at = spec.schedule.at
    if at is not None and at < datetime.now(UTC):
        note(f"warning: --at {rfc3339(at)} is in the past: the misfire policy ({spec.misfire.kind.value}) decides "
             "whether it fires now; its lag is counted as a catch-up, not as trigger lag")

    async def create(client: Client) -> int:
        job, created = await client.create_job(spec)
        if args.json:
            print_json({"created": created, **job_view(job)})
        elif created:
            print(f"created job {job.job_id} ({job.name}), next fire at {rfc3339(job.next_fire_at) or '-'}")
        else:
            print(f"job {job.job_id} ({job.name}) already exists with this spec; nothing changed")
        await _warn_if_unserved(client, job)
        return 0

    return run_remote(args, create)


async def _warn_if_unserved(client: Client, job: Job) -> None:
    """Say so when no worker connected to the node serves the job's type for its tenant: its runs
    would wait, silently."""
    try:
        workers = (await client.cluster()).workers
    except RemoteError:
        return  # the job is created; a status the caller cannot read changes nothing
    if not any(job.job_type in worker.job_types and worker.tenant in ("", job.tenant) for worker in workers):
        note(f"warning: no connected worker serves job type {job.job_type!r} for tenant {job.tenant!r}: its runs "
             "will wait until one does (`fastlane cluster` lists the workers and their job types)")


_UPDATE_FLAGS = ("now", "at", "cron", "every", "tz", "anchor", "jitter", "job_type", "payload", "payload_file", "priority",
                 "concurrency_key",
                 "concurrency_limit", "max_attempts", "max_retry_time", "backoff_base", "backoff_cap", "misfire",
                 "misfire_grace", "fire_all_cap", "overlap", "delivery", "timeout", "lease_ttl")


def update_job(args: argparse.Namespace) -> int:
    # Before connecting: a bad flag never costs a round trip.
    if not any(getattr(args, flag, None) not in (None, False) for flag in _UPDATE_FLAGS):
        raise UsageError("nothing to change: give at least one flag (see fastlane jobs update --help)")
    if any(getattr(args, kind, None) not in (None, False) for kind in ("now", "at", "cron", "every")):
        schedule_from_flags(args)

    async def update(client: Client) -> int:
        job = await resolve_job(client, args.job_id)
        spec = updated_spec(job.spec, args)
        unchanged = spec == job.spec
        if not unchanged:
            job = await client.update_job(job.job_id, spec)
        if args.json:
            print_json(job_view(job))
        elif unchanged:  # as a repeated pause says it
            print(f"job {job.job_id} ({job.name}) already has this spec; nothing changed")
        else:
            print(f"updated job {job.job_id} ({job.name}), next fire at {rfc3339(job.next_fire_at) or '-'}")
        await _warn_if_unserved(client, job)
        return 0

    return run_remote(args, update)


# -- list and single-job actions ---------------------------------------------------------------

JOB_COLUMNS = ("JOB_ID", "NAME", "TYPE", "STATE", "SCHEDULE", "NEXT_FIRE_AT")


def _job_row(job: Job) -> tuple[Any, ...]:
    return (job.job_id, job.name, job.job_type, state_shown(job), describe_schedule(job.spec.schedule), job.next_fire_at)


def list_jobs(args: argparse.Namespace) -> int:
    async def collect(client: Client) -> int:
        jobs, more = await collect_pages(
            lambda size, token: client.list_jobs(
                state=args.state, job_type=args.job_type, page_size=size, page_token=token,
                name=args.name, name_prefix=args.name_prefix,
            ),
            args.limit,
        )
        if args.json:
            print_json([job_view(job) for job in jobs])
            return 0
        print_table(JOB_COLUMNS, [_job_row(job) for job in jobs])
        if more:
            note(f"(showing the first {args.limit} jobs; raise --limit to see more)")
        return 0

    return run_remote(args, collect)


async def _delete_again(client: Client, args: argparse.Namespace) -> int:
    """``jobs delete ID`` of a job deleted before: said so, exit 0, as a second pause is; an id
    never used (or a name, which a deleted job no longer has) is refused as not found."""
    try:
        deleted = await client.delete_job(args.job_id)
    except RemoteNotFound:
        await resolve_job(client, args.job_id)  # raises the look-up's own message
        raise
    _print_deleted(args, deleted)
    return 0


def _print_deleted(args: argparse.Namespace, deleted: bool) -> None:
    if args.json:
        print_json({"job_id": args.job_id, "deleted": deleted, "already_deleted": not deleted})
    elif deleted:
        print(f"deleted job {args.job_id}")
    else:
        print(f"job {args.job_id} was deleted before; nothing changed")


def act_on_job(args: argparse.Namespace) -> int:
    """``get``, ``pause``, ``resume``, ``delete`` and ``trigger``: one job by id or name (the
    middle three, or a selection)."""
    if args.action in BULK_ACTIONS and one_job_or_a_selection(args):
        return run_remote(args, lambda client: act_on_selection(client, args))

    async def act(client: Client) -> int:
        try:
            found = await resolve_job(client, args.job_id)
        except FastlaneError:
            if args.action == "delete":  # by the id of a job deleted before: done already
                return await _delete_again(client, args)
            raise
        args.job_id = found.job_id
        if args.action == "trigger":
            run = await client.trigger_job(args.job_id)
            if args.json:
                print_json(run_view(run))
            else:
                print(f"triggered run {run.run_id} of job {run.job_id}, scheduled for {rfc3339(run.scheduled_for)}")
            return 0
        if args.action == "delete":
            _print_deleted(args, await client.delete_job(args.job_id))
            return 0
        if args.action == "get":
            return await show_job(client, args)
        wanted = JobState.PAUSED if args.action == "pause" else JobState.ACTIVE
        if found.state is wanted:  # a repeated verb succeeds, and says so
            job = found
            message = f"job {job.job_id} ({job.name}) is already {job.state.value}; nothing changed"
        else:
            if args.action == "pause":
                job = await client.pause_job(args.job_id, args.reason)
            else:
                job = await client.resume_job(args.job_id)
            if job.state is JobState.PAUSED:
                message = f"paused job {job.job_id} ({job.name}): it fires no more until resumed"
            else:
                message = (f"resumed job {job.job_id} ({job.name}): now {job.state.value}, next fire at "
                           f"{rfc3339(job.next_fire_at) or '-'}")
            message += f"; reason: {job.pause_reason}" if job.pause_reason else ""
        if args.json:
            print_json(job_view(job))
        else:
            print(message)
        return 0

    return run_remote(args, act)


async def show_job(client: Client, args: argparse.Namespace) -> int:
    """``jobs get``: the job, then its history (its own events and its runs', newest first)."""
    job = await client.get_job(args.job_id)
    history = await fetch_history(client, AuditTarget.JOB, job.job_id)
    if args.json:
        print_json({**job_view(job), "history": None if history is None else [audit_view(e) for e in history]})
        return 0
    print_fields(job_fields(job))
    print_history(history, targets=True)
    return 0
