"""``fairness``: a noisy tenant floods the workers it shares with a quiet one; how much later do the
quiet tenant's runs start?

Two tenants, one job type, the same workers: busy workers (a handler that takes 50 ms, 10 at once
per worker process: 200 runs/s with one process). One run, two phases of 20 s each:

- **alone**: the quiet tenant's one-shot jobs fall due evenly at a tenth of capacity (20/s);
- **with noisy**: the quiet tenant's go on the same, and the noisy tenant's one-shot jobs fall due
  evenly at 10x capacity (2,000/s): its backlog grows by about 1,800 runs a second and keeps
  every slot it may have.

The noisy tenant's runs are one-shot jobs (40,000 of them) rather than 2,000 interval jobs every
second: interval jobs' runs piling up unstarted would have the node fall behind releasing runs (of
both tenants), and this scenario measures the quiet tenant's wait for a slot, not that.

The target is the quiet tenant's p99 start lag in the second phase over its p99 in the first
(≤ 2): both from the same run, node and machine.

Why the noisy tenant is capped: the ready queues take turns across tenants, so a quiet run waits
behind at most one noisy run; but it also needs a free slot, and with every slot held by noisy
runs it waits for the next handler to end (5 ms on average here, up to a whole handler's time
when the handlers end together), while alone it is sent ahead and starts on its instant. So the
nodes run with ``--tenant-max-in-flight noisy=N``, N = 80 % of the slots each node's streams
offer (8 of 10): the quiet tenant, which needs about one slot (20/s x 50 ms), always finds one
free. A ``fastlane serve`` without that flag (a build from before it) runs the noisy tenant
uncapped, and the result and a note say so; ``NOISY_CAP_SHARE = None`` does the same on purpose.

Scaled: phases ``max(3, 20 x scale)`` s each; the rates stay (they are multiples of capacity).
"""

from __future__ import annotations

import math
from datetime import timedelta

from fastlane.bench.cluster import BUSY_JOB_TYPE, BusyWorkers, FastlaneCluster, serve_accepts
from fastlane.bench.harness import (
    CREATE_WORST_S,
    START_ALLOWANCE_S,
    Bench,
    Deadline,
    Offer,
    RecordTail,
    create_offers,
    even_offsets,
    micros,
    note_overrun,
    now_utc,
    sleep_until,
    split_by_label,
    started_between,
    system_result,
    wait_for_runs,
)
from fastlane.bench.stats import Deliveries, histogram_quantiles, stall_causes
from fastlane.bench.targets import NOISY, QUIET_ALONE, QUIET_WITH_NOISY

HANDLER_MS = 50
HANDLER_JITTER = 0.0  # 0: every handler takes exactly HANDLER_MS (see docs/benchmarks.md, "Handlers in step")
CONCURRENCY = 10  # per worker process: 10 x 1000 / 50 = 200 runs/s
QUIET_TENANT = "quiet"
NOISY_TENANT = "noisy"
QUIET_SHARE = 0.1  # of capacity: about one slot busy with quiet runs at a time
NOISY_TIMES = 10.0  # of capacity
NOISY_CAP_SHARE: float | None = 0.8  # of each node's slots the noisy tenant may hold; None: no cap
CAP_FLAG = "--tenant-max-in-flight"
PHASE_S = 20.0
MIN_PHASE_S = 3.0
GRACE_S = 60.0  # after the last quiet run is due, for it to start
LOOP_LAG = "fastlane_event_loop_lag_seconds"
LOOP_STALLS = "fastlane_event_loop_stalls_total"
# Labels of the jobs (and classes of runs), and the result each class gives.
ALONE, WITH_NOISY, FLOOD = "quiet-alone", "quiet-with-noisy", "noisy"
SYSTEMS = {ALONE: QUIET_ALONE, WITH_NOISY: QUIET_WITH_NOISY, FLOOD: NOISY}


def busy_workers(bench: Bench) -> BusyWorkers:
    return BusyWorkers(handler_ms=HANDLER_MS, concurrency=CONCURRENCY, processes=bench.workers, jitter=HANDLER_JITTER)


def phase_s(bench: Bench) -> float:
    return bench.seconds(PHASE_S, MIN_PHASE_S)


def rates(capacity: float) -> tuple[float, float]:
    """The quiet and the noisy tenant's offered runs per second."""
    return capacity * QUIET_SHARE, capacity * NOISY_TIMES


def offers(capacity: float, phase: float) -> list[Offer]:
    """The quiet tenant's runs over both phases, the noisy tenant's over the second, in due order."""
    quiet, noisy = rates(capacity)
    planned = [Offer(ALONE, offset, QUIET_TENANT) for offset in even_offsets(quiet, 0.0, phase)]
    planned += [Offer(WITH_NOISY, offset, QUIET_TENANT) for offset in even_offsets(quiet, phase, phase)]
    planned += [Offer(FLOOD, offset, NOISY_TENANT) for offset in even_offsets(noisy, phase, phase)]
    return sorted(planned, key=lambda offer: offer.offset_s)


def offered(planned: list[Offer]) -> dict[str, int]:
    """Runs offered of each label."""
    counts = dict.fromkeys(SYSTEMS, 0)
    for offer in planned:
        counts[offer.label] += 1
    return counts


def noisy_cap(slots: int, share: float | None = NOISY_CAP_SHARE) -> int | None:
    """Attempts of the noisy tenant in flight at once on each node: ``share`` of its ``slots``
    (at least 1, and at least one slot left over when there are two); None when not capped."""
    if share is None:
        return None
    return max(1, min(math.floor(slots * share), slots - 1))


def budget(bench: Bench) -> float:
    jobs = len(offers(busy_workers(bench).capacity_runs_per_s(bench.nodes), phase_s(bench)))
    return START_ALLOWANCE_S * 2 + jobs * CREATE_WORST_S + 2 * phase_s(bench) + GRACE_S


async def fairness(bench: Bench) -> list[dict[str, object]]:
    busy = busy_workers(bench)
    phase = phase_s(bench)
    capacity = busy.capacity_runs_per_s(bench.nodes)
    planned = offers(capacity, phase)
    cap = await _cap(bench, busy)
    url = await bench.fresh_database("fastlane")
    first, created, labels = await create_offers(bench, url, planned, BUSY_JOB_TYPE)
    node_args = [CAP_FLAG, f"{NOISY_TENANT}={cap}"] if cap else []
    counts = offered(planned)
    second = first + timedelta(seconds=phase)
    async with FastlaneCluster(bench, url, nodes=bench.nodes, busy=busy, node_args=node_args) as cluster:
        ready_at = await cluster.start()
        overrun = note_overrun(bench, first, ready_at)
        tail = RecordTail(cluster.record_paths)
        deadline = Deadline((first - now_utc()).total_seconds() + 2 * phase + GRACE_S)
        # The first node's metrics at each phase's bounds: how late its event loop woke in each.
        await sleep_until(first, bench.progress, "waiting for the first run")
        scraped = [await cluster.scrape_first()]
        await sleep_until(second, bench.progress, "quiet tenant alone")
        scraped.append(await cluster.scrape_first())
        await sleep_until(second + timedelta(seconds=phase), bench.progress, "quiet tenant with the noisy one")
        scraped.append(await cluster.scrape_first())
        await wait_for_runs(tail, counts[ALONE] + counts[WITH_NOISY], deadline, bench.progress,
                            keep=lambda record: labels.get(record.job_id) in (ALONE, WITH_NOISY),
                            label="quiet runs started")
    tail.read()  # after the stop: everything the workers wrote
    split = split_by_label(tail.records, labels)
    quiet_rate, noisy_rate = rates(capacity)
    common: dict[str, object] = {**busy.as_json(bench.nodes), "phase_s": round(phase, 2), "noisy_in_flight_cap": cap,
                                 "insert_s": round(created.seconds, 2), "lead_in_overrun_s": round(overrun, 2)}
    bounds = [micros(first), micros(second), micros(second + timedelta(seconds=phase))]
    results = []
    for label, system in SYSTEMS.items():
        got = split.get(label, Deliveries(first=[], duplicates=0))
        index = 0 if label == ALONE else 1  # its phase
        loop = _loop_figures(bench, system, scraped[index], scraped[index + 1])
        result = system_result(bench, system, jobs=counts[label], got=got,
                               tenant=NOISY_TENANT if label == FLOOD else QUIET_TENANT,
                               phase="alone" if label == ALONE else "with noisy",
                               offered_runs_per_s=round(noisy_rate if label == FLOOD else quiet_rate, 1),
                               started=len(got.start_lags_ms()), **common, **loop)
        # Runs of the class whose handler was entered during its phase, a second: what it got.
        result["runs_per_s"] = round(started_between(got.first, bounds[index], bounds[index + 1]) / phase, 1)
        if label != FLOOD and result["started"] != counts[label]:  # the flood never all starts: 10x capacity
            bench.note(f"{system}: {result['started']:,} of {counts[label]:,} runs started before the deadline")
        results.append(result)
    return results


def _loop_figures(bench: Bench, system: str, before: dict[str, float], after: dict[str, float]) -> dict[str, object]:
    """The first node's event-loop lag and stalls between two scrapes (its phase), noted once a phase."""
    lag = histogram_quantiles(before, after, LOOP_LAG, {"p50": 0.5, "p99": 0.99, "p999": 0.999})
    stalls = stall_causes(before, after, LOOP_STALLS)
    if system != NOISY:  # the noisy tenant's phase is the quiet one's second: noted there
        bench.note(f"node-1 event-loop lag while {system.removeprefix('fastlane ')}: p50/p99/p99.9 ≤ "
                   f"{lag['p50']}/{lag['p99']}/{lag['p999']} ms (bucket bounds); stalls ≥ 2 ms by cause: "
                   f"{stalls or 'none'}")
    return {"node_loop_lag_ms": lag, "node_loop_stalls": stalls}


async def _cap(bench: Bench, busy: BusyWorkers) -> int | None:
    """The noisy tenant's cap per node, if this ``fastlane serve`` has the flag (a note if not)."""
    cap = noisy_cap(busy.slots)
    if cap is None:
        bench.note("noisy tenant not capped (NOISY_CAP_SHARE is None): a quiet run waits for a slot to free")
        return None
    if not await serve_accepts(CAP_FLAG):
        bench.note(f"noisy tenant not capped: this fastlane serve has no {CAP_FLAG}; a quiet run that falls due "
                   "with every slot busy waits for a handler to end")
        return None
    bench.note(f"noisy tenant capped at {cap} of {busy.slots} slots per node ({CAP_FLAG} {NOISY_TENANT}={cap})")
    return cap
