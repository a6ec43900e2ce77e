"""``fastlane serve``, ``fastlane worker`` and ``fastlane migrate``: the long-running processes.

The node and the worker are imported only when their command runs, so client commands start
fast and do not depend on the daemon's modules.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastlane.cli.arguments import (
    SERVER_ENV,
    UsageError,
    client_tls,
    count_or_unlimited,
    history_retention_days,
    milliseconds_up_to,
    positive_int,
    positive_milliseconds,
    positive_seconds,
    priority_reserve,
    rate_or_unlimited,
    seconds_up_to,
    security_flags,
    server_address,
    servers_from_env,
    tenant_max_in_flight,
    tenant_weight,
    whole_number_from_0_up_to,
    whole_number_up_to,
)
from fastlane.domain.limits import (
    MAX_BACKLOG,
    MAX_BACKLOG_SECONDS,
    MAX_HISTORY_RETENTION,
    MAX_SEND_AHEAD,
    MAX_TENANT_IN_FLIGHT,
    MAX_TENANT_WEIGHT,
    MIN_HISTORY_RETENTION,
    PAYLOAD_CEILING_BYTES,
)
from fastlane.domain.quotas import TenantQuota
from fastlane.rpc.channel import DEFAULT_SERVER
from fastlane.server.grpc_server import MESSAGE_ENVELOPE_BYTES
from fastlane.server.settings import DEFAULT_DB_URL, DEFAULT_QUOTAS, Settings, default_node_id
from fastlane.storage import DEFAULT_SHARD_COUNT, open_store, redacted_url


def register(commands: Any) -> None:
    """Add ``serve``, ``worker`` and ``migrate`` to the top-level subparsers."""
    serve = commands.add_parser(
        "serve",
        help="run a fastlane node (the daemon)",
        description=(
            "Run a fastlane node. With no options: SQLite in the working directory, every shard, loopback only."
        ),
    )
    _add_db_flag(serve)
    _add_log_format_flag(serve)
    serve.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=DEFAULT_SERVER,
        help=f"address of the gRPC API (default: {DEFAULT_SERVER})",
    )
    serve.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="address other nodes and workers use to reach this node (default: the --listen address)",
    )
    serve.add_argument(
        "--node-id", metavar="ID", help="unique name of this node (default: $FASTLANE_NODE_ID, else host name and pid)"
    )
    serve.add_argument(
        "--metrics", metavar="HOST:PORT",
        help="serve Prometheus metrics on this separate address, over plain HTTP without a token; under --auth "
        "the tenant and job_type labels are pseudonyms, not names (t-/j- and 10 hex digits of an HMAC keyed by the "
        "--db URL: the same on every node given the same URL) (default: off; a non-loopback address needs --auth "
        "or --insecure)",
    )
    serve.add_argument(
        "--metrics-names", action="store_true",
        help="under --auth, show tenant names and job types in clear on --metrics: for a scrape that only "
        "trusted hosts can reach (default: pseudonyms)",
    )
    serve.add_argument(
        "--hide-payloads", action="store_true",
        help="never show a job's payload or a run's input, output or checkpoint (API and console), to any role; "
        "without it, every role but viewer sees them",
    )
    serve.add_argument(
        "--health", metavar="HOST:PORT",
        help="also serve the gRPC health service alone, without TLS or token, on this address (any address: it "
        "tells only SERVING or NOT_SERVING); for Kubernetes gRPC probes when the API uses TLS (default: off)",
    )
    serve.add_argument(
        "--console", metavar="HOST:PORT",
        help="serve the web console (jobs, runs, workflows, the cluster; sign-in with an API token under --auth) "
        "on this address, over HTTPS with --tls-cert/--tls-key; port 0 picks a free one, printed at start "
        "(default: off; a non-loopback address needs --auth and TLS, or --insecure)",
    )
    serve.add_argument(
        "--auth", action="store_true",
        help="require an API token (authorization: Bearer ...) on every call but health checks; each caller then "
        "acts for its token's tenant with its token's role. Make the first admin token with "
        "`fastlane tokens create --db URL --tenant T --role admin` (default: off, and then the node listens on "
        "loopback only)",
    )
    serve.add_argument("--tls-cert", metavar="FILE", type=Path,
                       help="serve the API over TLS with this PEM certificate (chain); re-read when the file changes")
    serve.add_argument("--tls-key", metavar="FILE", type=Path, help="the PEM private key of --tls-cert")
    serve.add_argument("--tls-client-ca", metavar="FILE", type=Path,
                       help="require client certificates signed by this PEM CA (mutual TLS); needs --tls-cert")
    quotas = serve.add_argument_group(
        "quotas", "defaults for every tenant without its own (`fastlane quotas set`); a number, or 'unlimited'")
    quotas.add_argument("--quota-max-jobs", metavar="N", type=count_or_unlimited,
                        default=DEFAULT_QUOTAS.max_jobs, help=f"jobs a tenant may have (default: {DEFAULT_QUOTAS.max_jobs:,})")
    quotas.add_argument("--quota-job-creations-per-second", metavar="R", type=rate_or_unlimited,
                        default=DEFAULT_QUOTAS.job_creations_per_second,
                        help="job creations per second per tenant, on each node "
                        f"(default: {DEFAULT_QUOTAS.job_creations_per_second:g})")
    quotas.add_argument("--quota-max-waiting-runs", metavar="N", type=count_or_unlimited,
                        default=DEFAULT_QUOTAS.max_waiting_runs,
                        help="runs due and not yet taken by a worker, beyond which the API adds no more for the "
                        f"tenant (triggers, retries, jobs to run now) (default: {DEFAULT_QUOTAS.max_waiting_runs:,})")
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow --listen on a non-loopback address without --auth and TLS, and --metrics without --auth "
        "(development only)",
    )
    serve.add_argument(
        "--shards",
        metavar="N",
        type=positive_int,
        default=DEFAULT_SHARD_COUNT,
        help=f"number of shards; every node of a cluster must agree (default: {DEFAULT_SHARD_COUNT})",
    )
    defaults = Settings(db_url=DEFAULT_DB_URL)
    serve.add_argument(
        "--shard-lease-ttl",
        metavar="SECONDS",
        type=positive_seconds,
        default=defaults.shard_lease_ttl.total_seconds(),
        help="how long a shard lease lasts without renewal; a crashed node's shards move after this "
        f"(default: {defaults.shard_lease_ttl.total_seconds():g})",
    )
    serve.add_argument(
        "--max-clock-offset",
        metavar="MS",
        type=positive_milliseconds,
        default=defaults.max_clock_offset.total_seconds() * 1000,
        help="a node whose wall clock is further than this from the database's owns no shards (within it, "
        "the node fires on its clock corrected to the database's): milliseconds, or a duration such as 0.5s "
        f"(default: {defaults.max_clock_offset.total_seconds() * 1000:g})",
    )
    serve.add_argument(
        "--max-ready-per-type",
        metavar="N",
        type=positive_int,
        default=defaults.max_ready_per_type,
        help="most released runs kept in memory per job type while no worker takes them; beyond it they wait "
        f"in the database and are read back as workers take runs (default: {defaults.max_ready_per_type})",
    )
    serve.add_argument(
        "--max-backlog",
        metavar="N",
        type=whole_number_up_to(MAX_BACKLOG),
        default=defaults.max_backlog,
        help="while this many due runs of one job type and tenant wait for a free worker credit or for "
        "the tenant's --tenant-max-in-flight (it gets less than is due), write no new runs of it: its due "
        "jobs wait in the window "
        f"and their misfire policy decides what runs once the backlog shrinks (default: {defaults.max_backlog})",
    )
    serve.add_argument(
        "--max-backlog-seconds",
        metavar="SECONDS",
        type=seconds_up_to(MAX_BACKLOG_SECONDS),
        default=defaults.max_backlog_seconds,
        help="hold a job type and tenant's due jobs as above also once its waiting runs are this many seconds "
        "of the runs it has lately sent to workers (at least 1,000 runs, or --max-backlog if less): a queue needs only the write lead's "
        "worth to keep its workers busy, and a flood stops being written within a second instead of filling "
        f"--max-backlog at its own rate; 0: --max-backlog alone (0..{MAX_BACKLOG_SECONDS:g}; "
        f"default: {defaults.max_backlog_seconds:g})",
    )
    serve.add_argument(
        "--max-ready-bytes-per-type",
        metavar="BYTES",
        type=positive_int,
        default=defaults.max_ready_bytes_per_type,
        help="most payload bytes of those runs kept in memory per job type; beyond it runs wait in the database "
        f"the same way (default: {defaults.max_ready_bytes_per_type})",
    )
    serve.add_argument(
        "--max-payload-bytes",
        metavar="N",
        type=positive_int,
        default=defaults.max_payload_bytes,
        help=f"largest job payload (and workflow input) accepted, in bytes; a larger one is refused with "
        f"INVALID_ARGUMENT naming the field, and a request larger than this (or than a worker's largest "
        f"checkpoint) plus {MESSAGE_ENVELOPE_BYTES >> 10} KiB is refused by the transport before it is parsed "
        f"(default: {defaults.max_payload_bytes}, at most {PAYLOAD_CEILING_BYTES})",
    )
    max_ahead_ms = MAX_SEND_AHEAD.total_seconds() * 1000
    serve.add_argument(
        "--send-ahead",
        metavar="MS",
        type=milliseconds_up_to(max_ahead_ms),
        default=defaults.send_ahead.total_seconds() * 1000,
        help="send a run up to this many milliseconds before its instant to a worker whose clock is known to "
        "agree with this node's to within that; the worker holds the run and starts it on the instant, so "
        "network and queueing delay stay out of its lag. Workers that do not measure their clock get runs on "
        f"the instant. Milliseconds, or a duration such as 0.2s; 0 turns it off (default: "
        f"{defaults.send_ahead.total_seconds() * 1000:g}, at most "
        f"{max_ahead_ms:g})",
    )
    serve.add_argument(
        "--tenant-weight",
        dest="tenant_weights",
        metavar="TENANT=N",
        type=tenant_weight,
        action="append",
        default=[],
        help="when runs of several tenants wait for the same workers, tenants take turns, each taking N runs "
        f"a turn (1..{MAX_TENANT_WEIGHT}); repeat for each tenant, e.g. --tenant-weight billing=3. Tenants not "
        "named weigh 1. Give every node the same weights",
    )
    serve.add_argument(
        "--tenant-max-in-flight",
        dest="tenant_caps",
        metavar="TENANT=N",
        type=tenant_max_in_flight,
        action="append",
        default=[],
        help="send at most N attempts of the tenant's runs to workers at once from this node (1.."
        f"{MAX_TENANT_IN_FLIGHT:,}); its other runs wait their turn while other tenants' go out, so workers it "
        "shares keep room for them. Per node: with K nodes the tenant may have K x N in flight (a "
        "cluster-wide cap is a job's concurrency key). Repeat for each tenant; tenants not named have no cap",
    )
    serve.add_argument(
        "--priority-reserve",
        metavar="PRIORITY=N",
        type=priority_reserve,
        default=None,
        help="keep N credits of every worker stream for runs of priority PRIORITY or more: other runs hold at "
        "most the stream's credits less N (at least one), so urgent runs start on time (sent ahead) however large "
        "the backlog of the others, as long as no more than N of them run at once; urgent runs may also take "
        "any other free credit; a negative PRIORITY is written --priority-reserve=-5=2. Default: none kept",
    )
    retention_days = (defaults.history_retention or timedelta(0)).total_seconds() / 86400
    serve.add_argument(
        "--history-retention",
        metavar="DAYS",
        type=history_retention_days,
        default=retention_days,
        help="delete finished runs (succeeded, failed, dead, skipped, cancelled, lost) and their attempts once they "
        "ended this many days ago (or a duration: 36h, 30d), a small batch at a time in the background; runs not "
        "finished are never deleted. "
        f"Fractions allowed (0.5 is 12 hours; at least an hour, {MIN_HISTORY_RETENTION / timedelta(days=1):.3g}; at most "
        f"{MAX_HISTORY_RETENTION.days}); 0 keeps history for ever (default: {retention_days:g})",
    )
    serve.set_defaults(handler=serve_node, command_parser=serve)

    worker = commands.add_parser(
        "worker",
        help="run a worker process for handlers defined in Python",
        description="Run a worker: connect to the daemons and execute runs with the handlers of MODULE:ATTR.",
    )
    worker.add_argument("target", metavar="MODULE:ATTR", help="the Worker object to run, e.g. myapp.tasks:worker")
    _add_log_format_flag(worker)
    worker.add_argument(
        "--server",
        dest="servers",
        metavar="HOST:PORT",
        action="append",
        type=server_address,
        help=f"a node to connect to (a host alone means port 7070); repeat for every node (default: ${SERVER_ENV}, "
        "else the worker's own list)",
    )
    worker.add_argument(
        "--concurrency",
        metavar="N",
        type=positive_int,
        help="most runs in flight per node stream (default: the worker's own setting)",
    )
    worker.add_argument(
        "--realtime-priority",
        metavar="N",
        type=whole_number_from_0_up_to(99),  # SCHED_FIFO's range on Linux (the worker package is not imported here)
        help="run the worker's event loop (and its async handlers) under Linux's real-time scheduling "
        "(SCHED_FIFO) at priority N, 1..99, so runs start on their instant while every core is busy; 0 turns it "
        "off. Needs CAP_SYS_NICE or ulimit -r, else the worker says why and runs normally; a loop that runs "
        "250 ms without blocking is lowered to normal scheduling (default: the worker's own setting, normally off)",
    )
    worker.add_argument(
        "--metrics", metavar="HOST:PORT",
        help="serve the worker's Prometheus metrics on HOST:PORT over plain HTTP (its attempts and handler "
        "durations by job type, handlers running, credits free, reconnects); default: the worker's own setting, "
        "normally none",
    )
    security_flags(worker.add_argument_group("token and TLS (default: the worker's own settings)"))
    worker.set_defaults(handler=run_worker, command_parser=worker)

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the database schema",
        description="Apply pending schema migrations, then exit. `fastlane serve` also does this at start-up.",
    )
    _add_db_flag(migrate)
    migrate.set_defaults(handler=migrate_schema, command_parser=migrate)


DB_ENV = "FASTLANE_DB"


def _add_db_flag(parser: argparse.ArgumentParser) -> None:
    # The environment variable keeps a password out of the process list (and Kubernetes args).
    parser.add_argument(
        "--db",
        metavar="URL",
        default=os.environ.get(DB_ENV, DEFAULT_DB_URL),
        help="database: sqlite:///path/to/file.db or postgresql://user@host/db; for a primary with "
        "standbys name every server and ask for the writable one, e.g. "
        "postgresql://user@pg-0:5432,pg-1:5432/db?target_session_attrs=read-write, and nodes follow a "
        f"promoted standby without a restart (default: ${DB_ENV}, else {DEFAULT_DB_URL})",
    )


def serve_node(args: argparse.Namespace) -> int:
    settings = Settings(
        db_url=args.db,
        listen=args.listen,
        advertise=args.advertise,
        node_id=args.node_id or default_node_id(),
        metrics_listen=args.metrics,
        metrics_names=args.metrics_names,
        hide_payloads=args.hide_payloads,
        health_listen=args.health,
        console_listen=args.console,
        auth=args.auth,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        insecure=args.insecure,
        quotas=TenantQuota(max_jobs=args.quota_max_jobs, job_creations_per_second=args.quota_job_creations_per_second,
                           max_waiting_runs=args.quota_max_waiting_runs),
        shard_count=args.shards,
        shard_lease_ttl=timedelta(seconds=args.shard_lease_ttl),
        max_clock_offset=timedelta(milliseconds=args.max_clock_offset),
        max_ready_per_type=args.max_ready_per_type,
        max_ready_bytes_per_type=args.max_ready_bytes_per_type,
        max_backlog=args.max_backlog,
        max_backlog_seconds=args.max_backlog_seconds,
        max_payload_bytes=args.max_payload_bytes,
        send_ahead=timedelta(milliseconds=args.send_ahead),
        tenant_weights=dict(args.tenant_weights),
        tenant_max_in_flight=dict(args.tenant_caps),
        priority_reserve=args.priority_reserve,
        history_retention=timedelta(days=args.history_retention) if args.history_retention else None,
    )
    from fastlane.server.node import serve

    return _finish(serve(settings, log_format=args.log_format))


def _add_log_format_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format", choices=("text", "json"), default=None,
        help="logs on stderr as lines of text or one JSON object per line (default: $FASTLANE_LOG_FORMAT, else "
        "text at a terminal and JSON otherwise); the level is $FASTLANE_LOG_LEVEL (default INFO)",
    )


def run_worker(args: argparse.Namespace) -> int:
    module, _, attribute = args.target.partition(":")
    if not module or not attribute:
        raise UsageError(f"worker target {args.target!r} must be MODULE:ATTR, e.g. myapp.tasks:worker")
    from fastlane.rpc.channel import load_token
    from fastlane.runtime import logs
    from fastlane.worker import run_worker_cli

    # Connections to nodes coming and going are worth seeing; runs are never logged at INFO.
    logs.configure(os.environ.get("FASTLANE_LOG_LEVEL", "INFO"),
                   json=None if args.log_format is None else args.log_format == "json")
    # Flags, then $FASTLANE_SERVER, override what the Worker object was built with.
    servers = args.servers or servers_from_env()
    return _finish(run_worker_cli(args.target, servers, args.concurrency,
                                  token=load_token(args.token_file), tls=client_tls(args),
                                  realtime_priority=args.realtime_priority, metrics=args.metrics))


def migrate_schema(args: argparse.Namespace) -> int:
    async def migrate() -> int:
        store = open_store(args.db)
        try:
            return await store.migrate()
        finally:
            await store.close()

    version = asyncio.run(migrate())
    print(f"schema at version {version} ({redacted_url(args.db)})")
    return 0


def _finish(outcome: Any) -> int:
    """The exit code of an entry point that may be synchronous or a coroutine to run."""
    if inspect.isawaitable(outcome):
        outcome = _run_fast(outcome)
    return int(outcome or 0)


def _run_fast(awaitable: Any) -> Any:
    # uvloop: lower timer and socket overhead for the long-running processes; it is a declared
    # dependency, but a missing wheel should not stop a node from starting.
    try:
        import uvloop
    except ImportError:
        return asyncio.run(awaitable)
    return uvloop.run(awaitable)
