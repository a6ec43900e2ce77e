"""``spread`` and ``burst``: one-shot jobs at known instants, on fastlane and on APScheduler.

- spread: 30,000 jobs due at 1,000 a second for 30 s (scaled: ``30,000 x scale`` jobs over
  ``max(1, 30 x scale)`` s).
- burst: 100,000 jobs due at the same instant (scaled: ``100,000 x scale``); the figure is how
  long after the instant the last run arrived.

Both systems get the same shape of due instants (the same offsets from a base time that each
picks after creating its jobs); they run one after the other, never at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta

from fastlane.bench.cluster import FastlaneCluster
from fastlane.bench.harness import (
    CREATE_WORST_S,
    JOB_TYPE,
    START_ALLOWANCE_S,
    Bench,
    Deadline,
    JobWriter,
    RecordTail,
    micros,
    note_overrun,
    now_utc,
    sleep_until,
    system_result,
    wait_for_runs,
)
from fastlane.bench.peer import (
    ADD_JOB_WORST_S,
    PEERS,
    STARTUP_ALLOWANCE_S,
    peer_available,
    run_peer,
)
from fastlane.bench.scenarios import floor
from fastlane.bench.scenarios.sustained import SUCCEEDED
from fastlane.bench.secure import secure
from fastlane.bench.stats import Deliveries, histogram_quantiles, stall_causes

from fastlane.domain.models import JobSpec, Schedule

# More figures of a run: from the metrics scraped before and after its runs fell due, and the
# seconds between the two scrapes.
After = Callable[[Mapping[str, float], Mapping[str, float], float], Awaitable[dict[str, object]]]
SECURED_SYSTEM = "fastlane-tls-token"  # the --secure run: TLS and an API token on every call and stream
SPREAD_JOBS = 30_000
SPREAD_OVER_S = 30.0
BURST_JOBS = 100_000
FASTLANE_GRACE_S = 60.0  # after the last due instant, for the last runs to arrive
PEER_GRACE_S = 60.0
PEER_SQL_GRACE_PER_JOB_S = 0.01  # the SQLAlchemy store deletes each fired job in its own transaction
SUCCEEDED_GRACE_S = 10.0  # burst: after the last receipt, for the last results to be durable
# A burst is started this long before its instant, so that the window (all of the burst) is
# loaded and every process is idle and connected when it comes.
BURST_LAUNCH_LEAD = timedelta(seconds=9)


async def spread(bench: Bench) -> list[dict[str, object]]:
    jobs = bench.scaled(SPREAD_JOBS, minimum=10)
    over = bench.seconds(SPREAD_OVER_S, minimum=1.0)
    offsets = [index * over / jobs for index in range(jobs)]
    return await _measure(bench, "spread", offsets)


async def burst(bench: Bench) -> list[dict[str, object]]:
    jobs = bench.scaled(BURST_JOBS, minimum=10)
    return await _measure(bench, "burst", [0.0] * jobs)


def spread_budget(bench: Bench) -> float:
    jobs = bench.scaled(SPREAD_JOBS, minimum=10)
    return _budget(jobs, bench.seconds(SPREAD_OVER_S, minimum=1.0), fastlane_runs=2 if bench.secure else 1)


def burst_budget(bench: Bench) -> float:
    own = _budget(bench.scaled(BURST_JOBS, minimum=10), 0.0, fastlane_runs=2 if bench.secure else 1)
    return own + (floor.budget(bench) if bench.floor else 0.0) + SUCCEEDED_GRACE_S


def _budget(jobs: int, over: float, *, fastlane_runs: int) -> float:
    fastlane = fastlane_runs * (START_ALLOWANCE_S + jobs * CREATE_WORST_S + over + FASTLANE_GRACE_S)
    peers = 2 * (STARTUP_ALLOWANCE_S + jobs * ADD_JOB_WORST_S + over + PEER_GRACE_S) + jobs * PEER_SQL_GRACE_PER_JOB_S
    return fastlane + peers + 60


async def _measure(bench: Bench, name: str, offsets: list[float]) -> list[dict[str, object]]:
    floor_result = await floor.floor_first(bench) if name == "burst" else None  # before any daemon
    results = [await _fastlane(bench, name, offsets)]
    if floor_result is not None:
        floor.compare_with_floor(results[0], floor_result)
        results.append(floor_result)
        bench.note("burst's runs/s is the delivery after the instant; its runs were written ahead before it, so "
                   "vs_floor compares the dispatch and results alone with the floor's three writes and can pass 1: "
                   "floor_cpu_share (CPU per run) is the comparable figure")
    if bench.secure:
        results.append(await _fastlane(bench, name, offsets, secured=True))
    if peer_available(bench):
        for system in PEERS:
            grace = PEER_GRACE_S + (PEER_SQL_GRACE_PER_JOB_S * len(offsets) if PEERS[system] == "sqlalchemy" else 0)
            result, got, base_us = await run_peer(bench, system, offsets, grace_s=grace)
            if name == "burst":
                result["last_delivery_after_instant_s"] = _last_after(got, base_us)
            results.append(result)
    return results


async def _fastlane(bench: Bench, name: str, offsets: list[float], *, secured: bool = False) -> dict[str, object]:
    system = SECURED_SYSTEM if secured else "fastlane"
    url = await bench.fresh_database("fastlane_secure" if secured else "fastlane")
    return await measure_fastlane(bench, name, offsets, url, system=system, secured=secured)


async def measure_fastlane(bench: Bench, name: str, offsets: list[float], url: str, *, system: str,
                           secured: bool = False, node_args: Sequence[str] = (),
                           after: After | None = None) -> dict[str, object]:
    """One-shot jobs due at ``offsets`` from a base instant, on a cluster over ``url``: the result
    of ``system``. ``node_args``: more ``fastlane serve`` flags; ``after``: more figures, read once
    the cluster has stopped, from the first node's metrics scraped as the runs fell due and once
    they had all arrived, and the seconds between the two scrapes."""
    jobs = len(offsets)
    security = await secure(url, bench.workdir / "tls") if secured else None
    launch_lead = max(bench.launch_lead, BURST_LAUNCH_LEAD) if name == "burst" else bench.launch_lead
    async with JobWriter(url, bench.progress) as writer:
        first = now_utc() + await writer.plan_lead_in(jobs, launch_lead)
        instants = [first + timedelta(seconds=offset) for offset in offsets]
        specs = (JobSpec(name=f"{name}-{index}", job_type=JOB_TYPE, schedule=Schedule.at_instant(instant))
                 for index, instant in enumerate(instants))
        created = await writer.create(specs, jobs, f"creating {jobs:,} one-shot jobs")
    # Start so that the first runs fall inside the window the node loads at start-up.
    await sleep_until(first - launch_lead, bench.progress, "waiting to start the processes")
    async with FastlaneCluster(bench, url, nodes=bench.nodes, workers=bench.workers, secured=security,
                               label="fastlane-secure" if secured else system.replace(" ", "-"),
                               node_args=node_args) as cluster:
        ready_at = await cluster.start()
        # CPU is measured from the processes being ready (a burst is all written ahead after
        # that) to the last result durable, so start-up and the window's first load are left out;
        # and node-1 is profiled over the same.
        meter = cluster.cpu_meter()
        profiler = cluster.profiler() if bench.profile else None
        meter.start()
        if profiler is not None:
            profiler.start()
        overrun = note_overrun(bench, first, ready_at)
        tail = RecordTail(cluster.record_paths)
        deadline = Deadline((max(instants) - now_utc()).total_seconds() + FASTLANE_GRACE_S)
        scraped_before, scraped_from = await cluster.scrape_first(), time.monotonic()
        received = await wait_for_runs(tail, jobs, deadline, bench.progress)
        scraped_after, scraped_for = await cluster.scrape_first(), time.monotonic() - scraped_from
        measured: dict[str, object] = {"cpu": meter.stop(runs=await _succeeded(cluster, received))}
        if profiler is not None:
            measured["profile"] = profiler.stop()
    got = tail.deliveries()  # after the stop: a run delivered twice while draining counts too
    figures: dict[str, object] = {"insert_s": round(created.seconds, 2), "lead_in_overrun_s": round(overrun, 2),
                                  **measured}
    # The first node's own view while the runs were due: how late its event loop woke, and why.
    figures["node_loop_lag_ms"] = histogram_quantiles(
        scraped_before, scraped_after, "fastlane_event_loop_lag_seconds", {"p50": 0.5, "p99": 0.99, "p999": 0.999})
    figures["node_loop_stalls"] = stall_causes(scraped_before, scraped_after, "fastlane_event_loop_stalls_total")
    figures["node_loop_stall_sites"] = stall_causes(scraped_before, scraped_after,
                                                    "fastlane_event_loop_stall_sites_total", label="site")
    lag = figures["node_loop_lag_ms"]
    bench.note(f"{system} node-1 event-loop lag p50/p99/p99.9 ≤ {lag['p50']}/{lag['p99']}/{lag['p999']} ms "
               f"(bucket bounds); stalls ≥ 2 ms by cause: {figures['node_loop_stalls'] or 'none'}; busy ones by "
               f"site: {figures['node_loop_stall_sites'] or 'none'}")
    if name == "burst":
        figures["last_delivery_after_instant_s"] = _last_after(got, micros(first))
    if got.delivered < jobs:
        bench.note(f"{system} delivered {got.delivered:,} of {jobs:,} runs before the deadline")
    if after is not None:
        figures.update(await after(scraped_before, scraped_after, scraped_for))
    return system_result(bench, system, jobs=jobs, got=got, **figures)


async def _succeeded(cluster: FastlaneCluster, received: int) -> int:
    """Runs succeeded on the nodes once the results of the ``received`` runs are durable (or
    :data:`SUCCEEDED_GRACE_S` has passed): the runs the CPU was spent on."""
    deadline = Deadline(SUCCEEDED_GRACE_S)
    while (succeeded := await cluster.metric_total(SUCCEEDED)) < received and not deadline.expired:
        await asyncio.sleep(0.2)  # each poll scrapes every node's metrics: on the nodes' CPU
    return int(succeeded)


def _last_after(got: Deliveries, instant_us: int) -> float | None:
    """Seconds from ``instant_us`` to the last first receipt."""
    if not got.first or not instant_us:
        return None
    return round((max(record.received_us for record in got.first) - instant_us) / 1e6, 4)
