"""``fastlane bench``: measure trigger lag, throughput, memory and failover on this machine.

Starts everything a scenario needs on 127.0.0.1 (a throwaway PostgreSQL for ``--backend
postgres``, fastlane nodes, no-op worker processes and, for spread and burst, APScheduler 3 as
the peer), runs it within a hard deadline, stops everything (also on Ctrl-C or an error) and
reports lag percentiles, runs per second, peak memory and the targets met or missed.
"""

# Only the flags live here; the benchmark itself is the ``bench`` package, imported when the
# command runs, so registering the command costs ``fastlane --help`` nothing.

from __future__ import annotations

import argparse

from fastlane.cli.arguments import UsageError, positive_int, whole_number_from_0_up_to, whole_number_up_to

SCENARIOS: dict[str, str] = {
    "spread": "30,000 one-shot jobs due at 1,000/s over 30 s: release and delivery lag; also on APScheduler",
    "burst": "100,000 jobs due at the same instant: how long after it the last run arrives; also on APScheduler",
    "sustained": "20,000 jobs every second: succeeded runs/s from the node's metrics over 30 s",
    "cron": "100,000 cron jobs '* * * * *': lag over two firings",
    "scale": "1,000,000 stored jobs: memory per in-window job, time to rebuild a 100,000-job window",
    "failover": "3+ nodes on PostgreSQL, one SIGKILLed under load: the gap until its shards fire again",
    "fairness": "a noisy tenant offers 10x what 50 ms handlers can take: the quiet tenant's start lag, alone and with it",
    "priority": "2x what 50 ms handlers can take, 1 run in 10 of high priority: its start lag, and the low backlog's wait",
    "concurrency": "1,000 runs sharing a concurrency key with limit 5, due at once on 3 nodes: the most running at once",
    "retention": "spread twice over 1,000,000 runs 40 days old: p99 start lag while the node trims them vs not",
    "workflow": "1,000 runs of a 10-step DAG: p99 of a parent's end to its child's start (≤ 10 ms)",
    "console": "100,000 jobs, 1,000,000 runs on PostgreSQL: p50/p95/max of each web console page (p95 ≤ 200 ms)",
    "floor": "the runs/s the database alone allows: each run's three writes, the node's statements, the raw driver",
    "soak": "--hours of a steady mix (interval, cron, one-shot, workflow) with a worker kill and a PostgreSQL "
            "restart every slice: RSS, files, threads, connections, loop and start lag per slice; nothing lost",
}

EPILOG = "scenarios:\n" + "\n".join(f"  {name:<10} {summary}" for name, summary in SCENARIOS.items()) + """

--scale multiplies job counts and durations (with floors that keep a run meaningful); cron at
scale < 1 uses a seconds-level schedule (*/N * * * * *) of period about 60 x scale s.
Targets that are missed are reported as MISSED; the command still exits 0. It exits 1 if the
run itself failed or ran past its hard deadline, 2 on bad flags, 130 when interrupted."""


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError(f"{text} must be above 0 and at most 10")
    return value


def _hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hours") from None
    if not 0.01 <= value <= 168:  # NaN fails here too
        raise argparse.ArgumentTypeError(f"{text} must be from 0.01 to 168 hours")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("scenario", metavar="SCENARIO", choices=tuple(SCENARIOS),
                        help=f"what to measure: {', '.join(SCENARIOS)} (see below)")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default=None,
                        help="fastlane's database: an SQLite file, or a throwaway PostgreSQL cluster started "
                             "for the run (the peer's SQLAlchemy store uses the same) (default: sqlite; "
                             "postgres for console, which measures PostgreSQL only)")
    parser.add_argument("--nodes", metavar="N", type=positive_int, default=None,
                        help="fastlane nodes sharing the database; more than 1 needs --backend postgres "
                             "(default: 1, and 3 for failover, which needs at least 3)")
    parser.add_argument("--workers", metavar="N", type=positive_int, default=1,
                        help="no-op worker processes, each connected to every node; for fairness and priority, "
                             "workers whose handler takes 50 ms, 10 at a time (default: 1)")
    parser.add_argument("--scale", metavar="FRACTION", type=_scale, default=1.0,
                        help="shrink (or grow) job counts and durations for a quick run, e.g. 0.01 (default: 1.0)")
    parser.add_argument("--no-peer", action="store_true",
                        help="measure fastlane only: do not run APScheduler on spread and burst")
    parser.add_argument("--secure", action="store_true",
                        help="spread and burst: run fastlane a second time with TLS and an API token on every call "
                             "and stream (after the plain run, same shape), and compare the two (needs the "
                             "bench extra's cryptography for the certificate)")
    parser.add_argument("--durable", action="store_true",
                        help="with --backend postgres: start the throwaway server with fsync, synchronous_commit "
                             "and full_page_writes on (PostgreSQL's defaults: a commit waits for its log to "
                             "reach the disk), to show what durability costs; without it they are off")
    parser.add_argument("--realtime-priority", metavar="N", type=whole_number_from_0_up_to(99), default=1,
                        help="run the threads that start runs (fastlane's workers' event loops, and the peer's "
                             "scheduler once its jobs are added) under Linux's real-time scheduling (SCHED_FIFO) "
                             "at priority N (1..99), as `fastlane worker --realtime-priority` does; 0: normal "
                             "scheduling. Needs CAP_SYS_NICE (root has it); the processes table says where it "
                             "was granted (default: 1)")
    parser.add_argument("--floor", action="store_true",
                        help="sustained and burst: first measure the floor (the database alone, same server, a "
                             "database of its own) and report fastlane's runs/s as a ratio to it")
    parser.add_argument("--profile", action="store_true",
                        help="sustained, burst and spread: sample node-1's stacks with py-spy (bench extra) over the measured "
                             "interval and report the share of samples in each stage of the node")
    parser.add_argument("--hours", metavar="H", type=_hours, default=None,
                        help="soak: how long to run, in hours (e.g. 1 for the record, at most 168); its figures "
                             "come in five-minute slices, or in sixths of a run shorter than half an hour "
                             "(default: 0.1)")
    parser.add_argument("--repeat", metavar="N", type=whole_number_up_to(100), default=1,
                        help="run the scenario N times (1..100), each from scratch, and report every run side by "
                             "side with the worst figure of any run and each target's status run by run; with "
                             "--out, each run's files go to DIR/run-K/ (default: 1)")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON document instead of the Markdown report")
    parser.add_argument("--out", metavar="DIR",
                        help="also write DIR/result.json, DIR/result.md, DIR/lag.png (when matplotlib is "
                             "installed), and the processes' logs and the workers' records of each run received "
                             "(DIR/logs/*-received-N.txt) to DIR/logs/")


def run(args: argparse.Namespace) -> int:
    nodes = args.nodes if args.nodes is not None else (3 if args.scenario == "failover" else 1)
    args.backend = args.backend or ("postgres" if args.scenario == "console" else "sqlite")  # its default: by scenario
    if args.scenario == "console" and (args.backend != "postgres" or nodes != 1):
        raise UsageError("console measures one node on PostgreSQL (its bulk load is PostgreSQL's): "
                         "use --backend postgres and leave --nodes at 1")
    if args.scenario == "failover" and (args.backend != "postgres" or nodes < 3):
        raise UsageError("failover needs --backend postgres and --nodes 3 or more")
    if nodes > 1 and args.backend != "postgres":
        raise UsageError("more than one node needs --backend postgres (SQLite serves a single node)")
    if args.durable and args.backend != "postgres":
        raise UsageError("--durable applies to --backend postgres (SQLite runs as fastlane always runs it: WAL, synchronous=NORMAL)")
    if args.secure and args.scenario not in ("spread", "burst"):
        raise UsageError("--secure applies to spread and burst")
    if args.floor and args.scenario not in ("sustained", "burst"):
        raise UsageError("--floor applies to sustained and burst")
    if args.profile and args.scenario not in ("sustained", "burst", "spread"):
        raise UsageError("--profile applies to sustained, burst and spread")
    if args.scenario == "floor" and nodes != 1:
        raise UsageError("floor measures the database alone: leave --nodes at 1")
    if args.hours is not None and args.scenario != "soak":
        raise UsageError("--hours applies to soak")
    if args.scenario == "soak" and args.repeat != 1:
        raise UsageError("a soak is one long run: give it more --hours rather than --repeat")
    if args.scenario == "soak" and (nodes != 1 or args.scale != 1.0 or args.workers != 1):
        raise UsageError("soak runs one node and its two workers at its own steady rate: leave --nodes, --workers "
                         "and --scale, and set --hours")
    if args.scenario == "scale" and nodes != 1:
        raise UsageError("scale measures one node: leave --nodes at 1")
    from fastlane.bench.runner import Options, run_benchmark

    # fastlane.bench is unknown to mypy (see [tool.mypy] in pyproject.toml): its result is typed here.
    status: int = run_benchmark(Options(scenario=args.scenario, backend=args.backend, nodes=nodes,
                                        workers=args.workers, scale=args.scale, peer=not args.no_peer,
                                        secure=args.secure, durable=args.durable,
                                        realtime_priority=args.realtime_priority,
                                        floor=args.floor, profile=args.profile, hours=args.hours,
                                        repeat=args.repeat,
                                        json=args.json, out=args.out))
    return status
