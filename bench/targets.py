"""The goals each scenario is measured against, evaluated from a result document.

A missed target is reported, never an error: the command still succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastlane.bench.stats import Target, lag_of, ratio, scale_note

from fastlane.engine.dispatch.ready_queue import AGING_BOUND_SECONDS

PEER_MEMORY = "apscheduler-memory"
PEER_SQLALCHEMY = "apscheduler-sqlalchemy"

SPREAD_P99_MS = 5.0
BURST_JOBS = 100_000
BURST_WITHIN_S = 1.5
SUSTAINED_RUNS_PER_S = 10_000.0
VS_SQLALCHEMY_AT_MOST = 0.1  # at least 10x lower
VS_MEMORY_AT_MOST = 2.0
START_VS_MEMORY_AT_MOST = 1.0  # runs sent ahead start on their instant: no worse than in-process
SECURED = "fastlane-tls-token"
SECURED_VS_PLAIN_AT_MOST = 1.1  # TLS and a token cost at most 10 % of p99
BYTES_PER_WINDOW_JOB = 500.0
REBUILD_JOBS = 100_000
REBUILD_S = 2.0
FAILOVER_SLACK_S = 1.0
# The systems of fairness and priority: one result per class of runs, named so.
QUIET_ALONE = "fastlane quiet alone"
QUIET_WITH_NOISY = "fastlane quiet with noisy"
NOISY = "fastlane noisy"
HIGH_PRIORITY = "fastlane high priority"
LOW_PRIORITY = "fastlane low priority"
QUIET_WITH_NOISY_AT_MOST = 2.0  # the noisy tenant's flood at most doubles the quiet tenant's p99 start lag
HIGH_PRIORITY_P99_MS = 10.0
# The systems of retention: the same spread over old history, kept and trimmed.
KEEPING_HISTORY = "fastlane keeping history"
TRIMMING_HISTORY = "fastlane trimming history"
WORKFLOW_HANDOFF_P99_MS = 10.0  # a workflow step starts within this of its parents' end (p99)
TRIMMING_VS_KEEPING_AT_MOST = 1.1  # trimming old history raises spread's p99 start lag by at most 10 %
CONSOLE_PAGE_P95_MS = 200.0  # every console page, over 100,000 jobs and 1,000,000 runs
CONSOLE_RUNS = 1_000_000
SOAK_GROWTH_AT_MOST = 1.05  # a resource's maximum in any later slice over the first slice's after the warm-up
SOAK_DRIFT_AT_MOST = 1.10  # the last slice's start-lag p99 (outside fault windows) over the first's
SOAK_RESOURCES = {"rss_bytes": "RSS", "open_files": "open files", "threads": "threads",
                  "db_connections": "database connections"}


def result_of(document: Mapping[str, Any], system: str) -> Mapping[str, Any] | None:
    """The result of ``system`` in the document, if it was measured."""
    for result in document.get("results", ()):
        if isinstance(result, Mapping) and result.get("system") == system:
            found: Mapping[str, Any] = result
            return found
    return None


def evaluate(document: Mapping[str, Any]) -> list[Target]:
    """The targets of the document's scenario, with the measured values filled in."""
    scenario = document.get("scenario")
    fastlane = result_of(document, "fastlane")
    if scenario == "spread":
        return _spread(document, fastlane)
    if scenario == "burst":
        return _burst(fastlane)
    if scenario == "sustained":
        return _sustained(document, fastlane)
    if scenario == "scale":
        return _scale(fastlane)
    if scenario == "failover":
        return _failover(fastlane)
    if scenario == "fairness":
        return _fairness(document)
    if scenario == "concurrency":
        return _concurrency(fastlane)
    if scenario == "priority":
        return _priority(document)
    if scenario == "retention":
        return _retention(document)
    if scenario == "workflow":
        return _workflow(fastlane)
    if scenario == "console":
        return _console(fastlane)
    if scenario == "soak":
        return _soak(fastlane)
    return []


def _spread(document: Mapping[str, Any], fastlane: Mapping[str, Any] | None) -> list[Target]:
    p99 = lag_of(fastlane, "delivery_lag_ms", "p99")
    targets = [Target(name="spread p99 delivery lag", limit=SPREAD_P99_MS, op="<=", unit="ms", measured=p99)]
    for peer, limit, wording in (
        (PEER_SQLALCHEMY, VS_SQLALCHEMY_AT_MOST, "spread p99 vs APScheduler + SQLAlchemy store (≥10x lower)"),
        (PEER_MEMORY, VS_MEMORY_AT_MOST, "spread p99 vs APScheduler in-memory store (≤2x)"),
    ):
        theirs = result_of(document, peer)
        measured = ratio(p99, lag_of(theirs, "delivery_lag_ms", "p99"))
        targets.append(Target(name=wording, limit=limit, op="<=", unit="ratio", measured=measured,
                              applies=theirs is not None, note="" if theirs else f"{peer} was not run"))
    # Start lag: the handler's entry (APScheduler's job function call). A result from before start
    # lags were recorded has none: the target is then N/A, not missed.
    start_p99 = lag_of(fastlane, "start_lag_ms", "p99")
    for peer, limit, wording in (
        (PEER_MEMORY, START_VS_MEMORY_AT_MOST, "spread p99 start lag vs APScheduler in-memory store (≤1x)"),
        (PEER_SQLALCHEMY, VS_SQLALCHEMY_AT_MOST, "spread p99 start lag vs APScheduler + SQLAlchemy store (≥10x lower)"),
    ):
        theirs = result_of(document, peer)
        measured = ratio(start_p99, lag_of(theirs, "start_lag_ms", "p99"))
        note = "" if theirs else f"{peer} was not run"
        if theirs and measured is None:
            note = "no start lag recorded (a worker or peer from before the start column)"
        targets.append(Target(name=wording, limit=limit, op="<=", unit="ratio", measured=measured,
                              applies=theirs is not None, note=note))
    return targets + _secured(document, fastlane)


def _secured(document: Mapping[str, Any], fastlane: Mapping[str, Any] | None) -> list[Target]:
    """What TLS and a token cost, from the same run. Start lag is compared: with runs sent ahead
    the delivery lag is negative (received before the instant), so its ratio means nothing;
    what a user sees is when the handler starts. Only with ``--secure``."""
    secured = result_of(document, SECURED)
    if secured is None:
        return []
    return [Target(name=f"spread p99 start lag with TLS and a token vs without (≤{SECURED_VS_PLAIN_AT_MOST:g}x)",
                   limit=SECURED_VS_PLAIN_AT_MOST, op="<=", unit="ratio",
                   measured=ratio(lag_of(secured, "start_lag_ms", "p99"), lag_of(fastlane, "start_lag_ms", "p99")))]


def _burst(fastlane: Mapping[str, Any] | None) -> list[Target]:
    if fastlane is None:
        return [Target(name="burst: all delivered within 1.5 s of the instant", limit=BURST_WITHIN_S, op="<=",
                       unit="s", measured=None)]
    jobs, delivered = int(fastlane.get("jobs", 0)), int(fastlane.get("delivered", 0))
    last = fastlane.get("last_delivery_after_instant_s")
    complete = delivered >= jobs
    note = scale_note(jobs, BURST_JOBS)
    if not complete:
        note = "; ".join(filter(None, [f"only {delivered:,} of {jobs:,} delivered", note]))
    # Runs never delivered count as infinitely late: the target is about all of them.
    measured = float(last) if complete and last is not None else (float("inf") if not complete else None)
    return [Target(name=f"burst: all {jobs:,} delivered within {BURST_WITHIN_S:g} s of the instant",
                   limit=BURST_WITHIN_S, op="<=", unit="s", measured=measured, note=note)]


def _sustained(document: Mapping[str, Any], fastlane: Mapping[str, Any] | None) -> list[Target]:
    backend, nodes = document.get("backend"), document.get("nodes", 1)
    applies = backend == "postgres" and nodes == 1
    note = "" if applies else f"the target is for PostgreSQL with one node (this run: {backend}, {nodes} node(s))"
    measured = fastlane.get("runs_per_s") if fastlane else None
    offered = fastlane.get("offered_runs_per_s") if fastlane else None
    if applies and measured is not None and offered is not None and offered < SUSTAINED_RUNS_PER_S:
        note = f"offered load was only {offered:,.0f} runs/s (scaled down): capacity not reached"
    return [Target(name="sustained runs/s (PostgreSQL, one node)", limit=SUSTAINED_RUNS_PER_S, op=">=",
                   unit="runs/s", measured=measured, applies=applies, note=note)]


def _scale(fastlane: Mapping[str, Any] | None) -> list[Target]:
    per_job = fastlane.get("bytes_per_window_job") if fastlane else None
    rebuild = fastlane.get("rebuild_s") if fastlane else None
    window = int(fastlane.get("window_jobs", 0)) if fastlane else 0
    return [
        Target(name="memory per in-window job", limit=BYTES_PER_WINDOW_JOB, op="<=", unit="bytes",
               measured=per_job, note=scale_note(window, REBUILD_JOBS)),
        Target(name=f"rebuild of a {window:,}-job window (start to SERVING)", limit=REBUILD_S, op="<=", unit="s",
               measured=rebuild, note=scale_note(window, REBUILD_JOBS)),
    ]


def _failover(fastlane: Mapping[str, Any] | None) -> list[Target]:
    ttl = float(fastlane.get("lease_ttl_s", 0)) if fastlane else 0.0
    gap = fastlane.get("failover_gap_s") if fastlane else None
    return [Target(name="failover gap (worst lateness of the killed node's shards)", limit=ttl + FAILOVER_SLACK_S,
                   op="<=", unit="s", measured=gap, note=f"lease TTL {ttl:g} s + {FAILOVER_SLACK_S:g} s")]


def _fairness(document: Mapping[str, Any]) -> list[Target]:
    """The quiet tenant's p99 start lag while the noisy one floods, over its p99 alone, same run."""
    alone, flooded = result_of(document, QUIET_ALONE), result_of(document, QUIET_WITH_NOISY)
    before, during = lag_of(alone, "start_lag_ms", "p99"), lag_of(flooded, "start_lag_ms", "p99")
    notes = [_unstarted(result) for result in (alone, flooded)]
    noisy = result_of(document, NOISY)
    if noisy is not None:
        cap = noisy.get("noisy_in_flight_cap")
        notes.append(f"noisy tenant capped at {cap} in flight per node" if cap else "noisy tenant not capped")
    measured = ratio(during, before) if before is None or before > 0 else None
    if before is not None and before <= 0:
        notes.append("quiet alone p99 ≤ 0 (started before its instant): no ratio")
    if flooded is not None and int(flooded.get("started", 0)) < int(flooded.get("jobs", 0)):
        measured = float("inf")  # a quiet run that never started while the noisy one flooded: infinitely late
    return [Target(name=f"fairness: quiet tenant p99 start lag with noisy flooding vs alone (≤{QUIET_WITH_NOISY_AT_MOST:g}x)",
                   limit=QUIET_WITH_NOISY_AT_MOST, op="<=", unit="ratio", measured=measured,
                   note="; ".join(filter(None, notes)))]


def _priority(document: Mapping[str, Any]) -> list[Target]:
    """High-priority runs start on time through the overload; no low-priority run waits past the
    aging bound. A run never started counts as infinitely late, as in burst."""
    high, low = result_of(document, HIGH_PRIORITY), result_of(document, LOW_PRIORITY)
    high_p99 = lag_of(high, "start_lag_ms", "p99")
    low_max = lag_of(low, "start_lag_ms", "max")
    low_wait = None if low_max is None else round(low_max / 1000, 3)
    if low is not None and int(low.get("started", 0)) < int(low.get("jobs", 0)):
        low_wait = float("inf")
    return [
        Target(name=f"priority: high-priority p99 start lag under 2x overload (≤{HIGH_PRIORITY_P99_MS:g} ms)",
               limit=HIGH_PRIORITY_P99_MS, op="<=", unit="ms", measured=high_p99, note=_unstarted(high)),
        Target(name=f"priority: longest low-priority wait within the aging bound (≤{AGING_BOUND_SECONDS:g} s)",
               limit=AGING_BOUND_SECONDS, op="<=", unit="s", measured=low_wait, note=_unstarted(low)),
    ]


def _concurrency(fastlane: Mapping[str, Any] | None) -> list[Target]:
    """The most handlers of the key running at once, from the workers' records: never above the
    limit; and every run ended (a run lost would make a low peak look good)."""
    limit = int(fastlane.get("concurrency_limit", 0)) if fastlane else 0
    peak = fastlane.get("most_running_at_once") if fastlane else None
    ended, jobs = (int(fastlane.get("runs_ended", 0)), int(fastlane.get("jobs", 0))) if fastlane else (0, 0)
    note = f"{ended:,} of {jobs:,} runs ended" + ("" if ended == jobs else ": some never ran")
    return [Target(name=f"concurrency key: most runs of the key running at once (≤ its limit, {limit})", limit=limit,
                   op="<=", unit="runs", measured=float("inf") if ended < jobs else peak, note=note)]


def _workflow(fastlane: Mapping[str, Any] | None) -> list[Target]:
    """A step's start after its parents' ends, p99; every step run ended, none twice."""
    p99 = lag_of(fastlane, "parent_end_to_child_start_ms", "p99")
    ended = int(fastlane.get("step_runs_ended", 0)) if fastlane else 0
    expected = int(fastlane.get("step_runs_expected", 0)) if fastlane else 0
    twice = int(fastlane.get("duplicates", 0)) if fastlane else 0
    note = f"{ended:,} of {expected:,} step runs ended, {twice} started twice"
    complete = ended == expected and twice == 0
    return [Target(name=f"workflow: p99 parent end → child start (≤{WORKFLOW_HANDOFF_P99_MS:g} ms)",
                   limit=WORKFLOW_HANDOFF_P99_MS, op="<=", unit="ms", measured=p99 if complete else float("inf"),
                   note=note)]


def _unstarted(result: Mapping[str, Any] | None) -> str:
    """A note when some of a class's runs never started (or the class was not measured)."""
    if result is None:
        return "not measured"
    offered, started = int(result.get("jobs", 0)), int(result.get("started", 0))
    return f"{result.get('system')}: only {started:,} of {offered:,} runs started" if started < offered else ""


def as_json(targets: Sequence[Target]) -> list[dict[str, object]]:
    return [target.as_json() for target in targets]


def _retention(document: Mapping[str, Any]) -> list[Target]:
    """Spread's p99 start lag while the node trims old history, over the same spread keeping it
    (same run). A run not delivered counts as infinitely late; nothing trimmed while the runs
    fell due, and the comparison does not apply."""
    keeping, trimming = result_of(document, KEEPING_HISTORY), result_of(document, TRIMMING_HISTORY)
    before, during = lag_of(keeping, "start_lag_ms", "p99"), lag_of(trimming, "start_lag_ms", "p99")
    measured = ratio(during, before) if before is None or before > 0 else None
    applies, note = True, ""
    if any(result is not None and int(result.get("delivered", 0)) < int(result.get("jobs", 0))
           for result in (keeping, trimming)):
        measured = float("inf")  # a run never delivered: infinitely late (a lost keeping run is a failure too)
    elif trimming is not None and not trimming.get("trimmed_while_due"):
        applies, note = False, "nothing was trimmed while the runs fell due"
    return [Target(name=f"spread p99 start lag while trimming old history vs keeping it (≤{TRIMMING_VS_KEEPING_AT_MOST:g}x)",
                   limit=TRIMMING_VS_KEEPING_AT_MOST, op="<=", unit="ratio", measured=measured, applies=applies,
                   note=note)]


def _console(fastlane: Mapping[str, Any] | None) -> list[Target]:
    """Each console page's p95 time to its last byte, one target a page; p50 and max beside it."""
    if fastlane is None:
        return [Target(name=f"console pages: p95 (≤{CONSOLE_PAGE_P95_MS:g} ms)", limit=CONSOLE_PAGE_P95_MS, op="<=",
                       unit="ms", measured=None, note="not measured")]
    runs = int(fastlane.get("stored_runs", 0))
    scaled = "" if runs >= CONSOLE_RUNS else f"measured over {runs:,} runs; the target is stated for {CONSOLE_RUNS:,}"
    targets = []
    for page in fastlane.get("pages", ()):
        figures = page.get("ms") or {}
        note = f"p50 {figures.get('p50')} ms, max {figures.get('max')} ms"
        targets.append(Target(name=f"console page {page.get('page')}: p95 (≤{CONSOLE_PAGE_P95_MS:g} ms)",
                              limit=CONSOLE_PAGE_P95_MS, op="<=", unit="ms", measured=lag_of(page, "ms", "p95"),
                              note="; ".join(filter(None, [note, scaled]))))
    return targets


def _soak(fastlane: Mapping[str, Any] | None) -> list[Target]:
    """Nothing grows after the first slice (the warm-up), the start lag does not drift, nothing lost or twice."""
    if fastlane is None:
        return []
    slices = len(fastlane.get("slices") or ())
    few = "" if slices >= 2 else "one slice: nothing to compare"
    grown = fastlane.get("growth") or {}
    targets = [Target(name=f"soak: {label} outside faults, largest later slice / first after the warm-up (≤{SOAK_GROWTH_AT_MOST:g})",
                      limit=SOAK_GROWTH_AT_MOST, op="<=", unit="x", measured=grown.get(name), applies=slices >= 2,
                      note=few)
               for name, label in SOAK_RESOURCES.items()]
    targets.append(Target(name=f"soak: start-lag p99 outside faults, last slice / first (≤{SOAK_DRIFT_AT_MOST:g})",
                          limit=SOAK_DRIFT_AT_MOST, op="<=", unit="x", measured=fastlane.get("start_lag_drift"),
                          applies=slices >= 2, note=few))
    expected = int(fastlane.get("occurrences_expected", 0))
    steps = int(fastlane.get("workflow_steps_expected", 0))
    lost = int(fastlane.get("lost", 0)) + int(fastlane.get("workflow_steps_lost", 0))
    twice = int(fastlane.get("twice", 0)) + int(fastlane.get("workflow_steps_twice", 0))
    targets.append(Target(name="soak: occurrences and workflow steps lost (0)", limit=0, op="<=", unit="",
                          measured=lost, note=f"of {expected:,} occurrences and {steps:,} workflow steps"))
    targets.append(Target(name="soak: occurrences run twice, workflow steps started twice (0)", limit=0, op="<=",
                          unit="", measured=twice))
    return targets
