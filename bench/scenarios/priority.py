"""``priority``: the workers are offered twice what they can take; do high-priority runs still start
on time, and does every low-priority run start within the aging bound?

One tenant, one job type, busy workers (a handler that takes 50 ms, 10 at once per worker process:
200 runs/s with one process). For 40 s one-shot jobs fall due evenly at 2x capacity (400/s); every
tenth is of high priority (100), the others of low priority (-1000). Then nothing more falls due,
and the run goes on until the backlog has drained and every run has started, so that each is
accounted for.

Targets: the high-priority runs' p99 start lag ≤ 10 ms (with every slot busy, a run waits for the
next handler to end: 5 ms on average here); the longest low-priority wait (its start lag) ≤
``AGING_BOUND_SECONDS``, the longest a run of the lowest priority can be overtaken by newcomers.

Why -1000 and not 0: aging. A waiting run gains 20 points a second, so a high run goes before a
low one only while that low one has waited less than ``(high - low) / 20`` s (``high_ahead_for_s``
in the result). Here low runs arrive at 360/s and are served at about 160/s, so the oldest one
waiting has waited about 0.55 x the time since the overload began: with 100 against 0 (5 s) the
high runs would fall behind the backlog after about 9 s and wait as long as it; with 100 against
-1000 (55 s) they stay ahead for all 40 s.

Why a reserve: with every slot busy, a high run that falls due waits for a handler to end, and
handlers that all take 50 ms end together (see docs/benchmarks.md), so it waits up to a whole
handler's time however high its priority. So the nodes run with ``--priority-reserve
100=N``: low runs hold at most the slots less N of each stream, and a high run finds a free one
at its instant (it is sent ahead and starts on it). N is the high runs a stream has at once, plus
one: each holds its slot for the send-ahead lead, the handler and the way back of its result
(``reserved_credits``). The low runs pay for it with N slots. A ``fastlane serve`` without the
flag (a build from before it) runs without a reserve, and the result and a note say so;
``RESERVE = False`` does the same on purpose.

Scaled: overload ``max(5, 40 x scale)`` s; the rates stay (they are multiples of capacity).
"""

from __future__ import annotations

import math

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
    split_by_label,
    started_between,
    system_result,
    wait_for_runs,
)
from fastlane.bench.stats import Deliveries
from fastlane.bench.targets import HIGH_PRIORITY, LOW_PRIORITY

from fastlane.engine.dispatch.ready_queue import AGING_BOUND_SECONDS, AGING_PER_SECOND

HANDLER_MS = 50
HANDLER_JITTER = 0.0  # 0: every handler takes exactly HANDLER_MS (see docs/benchmarks.md, "Handlers in step")
CONCURRENCY = 10  # per worker process: 10 x 1000 / 50 = 200 runs/s
TIMES_CAPACITY = 2.0  # offered load during the overload
HIGH_EVERY = 10  # one run in ten is of high priority
HIGH, LOW = 100, -1000  # priorities
OVERLOAD_S = 40.0
MIN_OVERLOAD_S = 5.0
RESERVE = True  # run the nodes with --priority-reserve HIGH=reserved_credits(...)
RESERVE_FLAG = "--priority-reserve"
SEND_AHEAD_MS = 20  # the nodes' --send-ahead (default)
RESULT_BACK_MS = 5  # a slot's way back: the worker holds results up to 4 ms, then the hop
DRAIN_ALLOWANCE = 3.0  # x the expected drain time, for the backlog to drain (a hard bound only)
GRACE_S = 60.0
# Labels of the jobs (and classes of runs), and the result each class gives.
SYSTEMS = {"high": HIGH_PRIORITY, "low": LOW_PRIORITY}
PRIORITIES = {"high": HIGH, "low": LOW}


def busy_workers(bench: Bench) -> BusyWorkers:
    return BusyWorkers(handler_ms=HANDLER_MS, concurrency=CONCURRENCY, processes=bench.workers, jitter=HANDLER_JITTER)


def overload_s(bench: Bench) -> float:
    return bench.seconds(OVERLOAD_S, MIN_OVERLOAD_S)


def offers(capacity: float, overload: float) -> list[Offer]:
    """Runs due evenly at ``TIMES_CAPACITY x capacity`` for ``overload`` s, every ``HIGH_EVERY``-th high."""
    return [Offer("high", offset, priority=HIGH) if index % HIGH_EVERY == 0 else Offer("low", offset, priority=LOW)
            for index, offset in enumerate(even_offsets(capacity * TIMES_CAPACITY, 0.0, overload))]


def reserved_credits(busy: BusyWorkers) -> int:
    """Credits of each stream to keep for high runs: how many a stream has at once (its share of
    the high runs' rate x how long each holds a slot), plus one."""
    high_per_stream = busy.concurrency * 1000 / busy.handler_ms * TIMES_CAPACITY / HIGH_EVERY
    holds_s = (SEND_AHEAD_MS + busy.handler_ms * (1 + busy.jitter) + RESULT_BACK_MS) / 1000
    return min(math.ceil(high_per_stream * holds_s) + 1, busy.concurrency - 1)


def drain_s(overload: float) -> float:
    """How long the backlog left when offering stops takes to drain at the nominal capacity."""
    return overload * (TIMES_CAPACITY - 1)


def high_ahead_for_s() -> float:
    """How long a low run may wait before high runs falling due no longer go before it (aging)."""
    return (HIGH - LOW) / AGING_PER_SECOND


def oldest_low_wait_s(overload: float) -> float:
    """How long the oldest waiting low run has waited when the overload ends, at the nominal
    capacity: low runs arrive at ``(1 - 1/HIGH_EVERY) x TIMES_CAPACITY`` of it and get what the high
    runs leave, ``1 - TIMES_CAPACITY / HIGH_EVERY`` of it; the low runs served are the oldest."""
    arriving = (1 - 1 / HIGH_EVERY) * TIMES_CAPACITY
    served = 1 - TIMES_CAPACITY / HIGH_EVERY
    return overload * (1 - served / arriving)


def budget(bench: Bench) -> float:
    overload = overload_s(bench)
    jobs = len(offers(busy_workers(bench).capacity_runs_per_s(bench.nodes), overload))
    return START_ALLOWANCE_S * 2 + jobs * CREATE_WORST_S + overload + DRAIN_ALLOWANCE * drain_s(overload) + GRACE_S


async def priority(bench: Bench) -> list[dict[str, object]]:
    busy = busy_workers(bench)
    overload = overload_s(bench)
    capacity = busy.capacity_runs_per_s(bench.nodes)
    planned = offers(capacity, overload)
    reserve = await _reserve(bench, busy)
    node_args = [RESERVE_FLAG, f"{HIGH}={reserve}"] if reserve else []
    url = await bench.fresh_database("fastlane")
    first, created, labels = await create_offers(bench, url, planned, BUSY_JOB_TYPE)
    async with FastlaneCluster(bench, url, nodes=bench.nodes, busy=busy, node_args=node_args) as cluster:
        ready_at = await cluster.start()
        overrun = note_overrun(bench, first, ready_at)
        tail = RecordTail(cluster.record_paths)
        wait = (first - now_utc()).total_seconds() + overload + DRAIN_ALLOWANCE * drain_s(overload) + GRACE_S
        await wait_for_runs(tail, len(planned), Deadline(wait), bench.progress, label="runs started (and drained)")
    tail.read()  # after the stop: everything the workers wrote
    split = split_by_label(tail.records, labels)
    start_us = micros(first)
    end_us = start_us + round(overload * 1e6)
    last_start_us = max((record.started_us for record in tail.records), default=0)
    common: dict[str, object] = {
        **busy.as_json(bench.nodes), "overload_s": round(overload, 2), "times_capacity": TIMES_CAPACITY,
        "total_offered_runs_per_s": round(capacity * TIMES_CAPACITY, 1), "high_ahead_for_s": high_ahead_for_s(),
        "aging_bound_s": AGING_BOUND_SECONDS, "reserved_credits": reserve,
        "drained_after_s": round((last_start_us - end_us) / 1e6, 2) if last_start_us else None,
        "insert_s": round(created.seconds, 2), "lead_in_overrun_s": round(overrun, 2),
    }
    results = []
    for label, system in SYSTEMS.items():
        got = split.get(label, Deliveries(first=[], duplicates=0))
        offered = sum(1 for offer in planned if offer.label == label)
        result = system_result(bench, system, jobs=offered, got=got, priority=PRIORITIES[label],
                               offered_runs_per_s=round(offered / overload, 1), started=len(got.start_lags_ms()),
                               **common)
        # Runs of the class whose handler was entered during the overload, a second: what it got.
        result["runs_per_s"] = round(started_between(got.first, start_us, end_us) / overload, 1)
        if result["started"] != offered:
            bench.note(f"{system}: {result['started']:,} of {offered:,} runs started before the deadline")
        results.append(result)
    return results


async def _reserve(bench: Bench, busy: BusyWorkers) -> int | None:
    """The credits each stream keeps for high runs, if this ``fastlane serve`` has the flag (a note if not)."""
    if not RESERVE:
        bench.note("no priority reserve (RESERVE is False): a high run that falls due with every slot busy waits "
                   "for a handler to end")
        return None
    if not await serve_accepts(RESERVE_FLAG):
        bench.note(f"no priority reserve: this fastlane serve has no {RESERVE_FLAG}; a high run that falls due with "
                   "every slot busy waits for a handler to end")
        return None
    reserve = reserved_credits(busy)
    bench.note(f"{reserve} of each stream's {busy.concurrency} credits kept for high runs ({RESERVE_FLAG} {HIGH}={reserve})")
    return reserve
