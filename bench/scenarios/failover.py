"""``failover``: three (or more) nodes on PostgreSQL, one SIGKILLed under load.

1,000 interval jobs fire every second, their phases spread over the second, across every node's
shards; one worker process is connected to all the nodes. After a warm-up the last node is
killed (SIGKILL: no hand-over). Its shards fire again once the survivors see it gone and its
leases run out. The gap is the worst lateness (receipt − scheduled) of any run of the killed
node's shards scheduled from just before the kill on; the target is the lease TTL + 1 s. Runs
of those shards that were due meanwhile should still all come (late): the misfire grace (10 s)
is longer than the TTL used here (5 s), so any that never came are reported as missing.
Scaled: ``1,000 x scale`` jobs (at least 30) and a warm-up of ``max(4, 10 x scale)`` s; the
time after the kill is never scaled (3 x TTL + 5 s), as the gap needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from fastlane.bench.cluster import FastlaneCluster
from fastlane.bench.harness import (
    CREATE_WORST_S,
    SHARDS,
    START_ALLOWANCE_S,
    Bench,
    RecordTail,
    create_phased_interval_jobs,
    micros,
    note_overrun,
    sleep_until,
    system_result,
)
from fastlane.bench.stats import Deliveries, RunRecord, percentiles

from fastlane.client import Client
from fastlane.domain.models import shard_of

JOBS = 1_000
EVERY = timedelta(seconds=1)
LEASE_TTL = timedelta(seconds=5)
MATERIALISED_AHEAD = timedelta(seconds=1)  # runs written (by the victim) up to this long before the kill count


@dataclass(frozen=True, slots=True)
class Timing:
    warmup_s: float
    after_kill_s: float

    @property
    def total(self) -> float:
        return self.warmup_s + self.after_kill_s


def timing(bench: Bench) -> Timing:
    return Timing(warmup_s=bench.seconds(10.0, 4.0), after_kill_s=3 * LEASE_TTL.total_seconds() + 5)


def budget(bench: Bench) -> float:
    return START_ALLOWANCE_S * 2 + bench.scaled(JOBS, 30) * CREATE_WORST_S + timing(bench).total


async def failover(bench: Bench) -> list[dict[str, object]]:
    jobs = bench.scaled(JOBS, minimum=30)
    times = timing(bench)
    url = await bench.fresh_database("fastlane")
    first, created = await create_phased_interval_jobs(bench, url, jobs, EVERY)
    async with FastlaneCluster(bench, url, nodes=bench.nodes, workers=bench.workers, lease_ttl=LEASE_TTL) as cluster:
        ready_at = await cluster.start()
        overrun = note_overrun(bench, first, ready_at)
        await sleep_until(first + timedelta(seconds=times.warmup_s), bench.progress, "running under load")
        victim = len(cluster.daemons)
        async with Client(cluster.daemons[0].address) as client:
            status = await client.cluster()
        shards = {shard.shard_id for shard in status.shards if shard.owner == f"node-{victim}"}
        killed_at = cluster.kill(victim - 1)
        await sleep_until(killed_at + timedelta(seconds=times.after_kill_s), bench.progress,
                          f"node-{victim} killed: watching its shards")
    tail = RecordTail(cluster.record_paths)
    killed_us = micros(killed_at)
    watched_until_us = killed_us + round((times.after_kill_s - LEASE_TTL.total_seconds() - 2) * 1e6)

    def victims(record: RunRecord) -> bool:
        return shard_of(record.job_id, SHARDS) in shards

    def since_kill(record: RunRecord) -> bool:
        return record.scheduled_us >= killed_us - round(MATERIALISED_AHEAD.total_seconds() * 1e6)

    affected = tail.deliveries(lambda record: victims(record) and since_kill(record))
    after_kill = tail.deliveries(since_kill)
    everything = tail.deliveries()
    figures: dict[str, object] = {
        "lease_ttl_s": LEASE_TTL.total_seconds(),
        "killed_node": f"node-{victim}",
        "killed_shards": len(shards),
        "insert_s": round(created.seconds, 2),
        "lead_in_overrun_s": round(overrun, 2),
        "victim_delivery_lag_ms": percentiles(affected.delivery_lags_ms()),
        "missing_occurrences": _missing(everything, victims, killed_us, watched_until_us),
    }
    lateness = [(record.received_us - record.scheduled_us) / 1e6 for record in affected.first]
    figures["failover_gap_s"] = round(max(lateness), 3) if lateness else None
    resumed = [record.received_us for record in affected.first if record.received_us > killed_us]
    figures["first_delivery_after_kill_s"] = round((min(resumed) - killed_us) / 1e6, 3) if resumed else None
    if not shards:
        bench.note(f"node-{victim} owned no shard when it was killed: nothing to fail over")
    result = system_result(bench, "fastlane", jobs=jobs, got=after_kill, **figures)
    result["delivered"], result["duplicates"] = everything.delivered, everything.duplicates
    return [result]


def _missing(got: Deliveries, keep: Callable[[RunRecord], bool], start_us: int, end_us: int) -> int:
    """Occurrences of the kept jobs due after ``start_us`` up to ``end_us`` that never arrived.

    A job's phase within the second is read off any run of it received (before the kill).
    """
    period = round(EVERY.total_seconds() * 1e6)
    phases: dict[str, int] = {}
    received: set[tuple[str, int]] = set()
    for record in got.first:
        if not keep(record):
            continue
        phases.setdefault(record.job_id, record.scheduled_us % period)
        received.add((record.job_id, record.scheduled_us))
    missing = 0
    for job_id, offset in phases.items():
        instant = start_us - (start_us - offset) % period + period  # the first occurrence after start
        while instant <= end_us:
            missing += (job_id, instant) not in received
            instant += period
    return missing
