"""The fault table: one cluster taken through every kind of fault in turn, each judged the same
way, from the workers' own records.

Three nodes on PostgreSQL with a synchronous streaming standby (``pg_basebackup``), each node
reaching the primary through a proxy of its own that can make its network hang, and naming the
standby too (``target_session_attrs=read-write``). Two recording workers. Sixty jobs fire every
second throughout. Then, one after another, each given time to settle:

1. a worker SIGKILLed;
2. a node SIGSTOPped inside a fenced transaction (its shard rows locked ``FOR KEY SHARE``) for
   longer than its lease, then continued;
3. a node SIGKILLed (and left dead);
4. a node's network to the database stalled (nothing reset) for 2.5 leases, then flowing again;
5. PostgreSQL restarted (``pg_ctl restart -m fast``);
6. the primary killed and, longer than a lease later, the standby promoted.

No node is restarted by hand. For each fault, over the occurrences due from it until the next:
none lost (each has a run a worker saw succeed), none with two succeeded runs, and the gap at
most a lease TTL plus a second: from when the fault cleared (or the occurrence was due, if
later) to when the handler of the attempt that succeeded started. The table is printed (``fault table: [...]``) and written as JSON
to FASTLANE_CHAOS_REPORT when that names a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import orjson
import pytest
from e2e_support import HERE, read_records, wait_for
from health_watch import HealthLog, alive, watch_health
from stall_proxy import StallProxy

from fastlane.client import Client
from fastlane.domain.limits import MIN_BACKOFF
from fastlane.domain.models import JobSpec, MisfireKind, MisfirePolicy, RetryPolicy, Schedule
from fastlane.testing.postgres import (
    StandbyPostgres,
    ThrowawayPostgres,
    create_database,
    multi_host_dsn,
    replicated_pair,
)
from fastlane.testing.processes import Daemon, WorkerProcess, child_environment

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.postgres]

LEASE_TTL = 3.0  # seconds, of shard leases; runs' worker leases are as short as allowed (3 s) too
MAX_GAP = LEASE_TTL + 1.0
SHARDS = 16
JOBS = 60
EVERY = timedelta(seconds=1)
LEAD_IN = timedelta(seconds=5)  # to create the jobs before their first occurrence
PROMOTE_AFTER = LEASE_TTL + 1.0  # seconds from the primary's crash to the standby's promotion
HANDLER_SECONDS = 0.2
# Time-critical jobs retry at once: an attempt whose worker died is delivered again as its lease ends.
RETRY = RetryPolicy(backoff_base=MIN_BACKOFF, backoff_cap=MIN_BACKOFF)
SETTLE = LEASE_TTL + 3.0  # seconds from a fault clearing to the next fault
DATABASE = "fastlane"


@dataclass
class Fault:
    """One fault as the test dealt it: when it struck, and when its cause ended (for a process
    that was killed or frozen, the moment it struck: the rest of the cluster must cover at once)."""

    name: str
    struck: datetime
    cleared: datetime
    note: str = ""

    @property
    def database_down_s(self) -> float:
        return round((self.cleared - self.struck).total_seconds(), 2)


def tick_offset(anchor: datetime, offset: float) -> float:
    """Seconds from now until ``offset`` seconds after the next occurrence."""
    since = (datetime.now(UTC) - anchor).total_seconds() % EVERY.total_seconds()
    return (EVERY.total_seconds() - since + offset) % EVERY.total_seconds()


@pytest.fixture
def database_pair() -> Iterator[tuple[ThrowawayPostgres, StandbyPostgres]]:
    primary, standby = replicated_pair(synchronous=True)
    try:
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()


@contextlib.asynccontextmanager
async def proxies(upstream: str, count: int) -> AsyncIterator[list[StallProxy]]:
    opened = [await StallProxy.for_dsn(upstream).start() for _ in range(count)]
    try:
        yield opened
    finally:
        for proxy in opened:
            await proxy.close()




async def freeze_inside_fenced_transaction(dsn: str, node: Daemon, node_id: str) -> str:
    """SIGSTOP ``node`` while it is inside a fenced transaction, and return the state of that
    transaction's session just after (``idle in transaction``: frozen with its locks held).

    The test holds ``runs`` in SHARE mode, so the node's next write of runs waits on it after
    its fence has locked its shard rows; the node is stopped while it waits, and the test lets
    go. The wait is bounded by the node's ``lock_timeout`` (TTL/4), so the poll is quick.
    """
    waiting = """
        SELECT a.pid FROM pg_stat_activity a
        WHERE a.application_name = $1 AND a.wait_event_type = 'Lock'
          AND EXISTS (SELECT 1 FROM pg_locks l
                      WHERE l.pid = a.pid AND l.granted AND l.relation = 'shards'::regclass AND l.mode = 'RowShareLock')
    """
    observer, locker = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + 20
        while True:
            async with locker.transaction():
                await locker.execute("LOCK TABLE runs IN SHARE MODE")
                pid = None
                until = time.monotonic() + 1  # the node's own wait gives up after TTL/4 anyway
                while pid is None and time.monotonic() < until:
                    pid = await observer.fetchval(waiting, node_id)
                    if pid is None:
                        await asyncio.sleep(0.005)
                if pid is not None:
                    node.popen.send_signal(signal.SIGSTOP)
            if pid is not None:
                await asyncio.sleep(0.1)  # the statement the lock held back completes; the client is frozen
                state = await observer.fetchval("SELECT state FROM pg_stat_activity WHERE pid = $1", pid)
                if state == "idle in transaction":
                    return state
                node.popen.send_signal(signal.SIGCONT)  # its wait had just timed out: try again
            assert time.monotonic() < deadline, f"{node_id} never waited inside a fenced transaction"
            await asyncio.sleep(0.3)
    finally:
        await observer.close()
        await locker.close()


@pytest.mark.timeout(300)
async def test_every_fault_in_turn_loses_no_occurrence_and_succeeds_none_twice(database_pair, tmp_path, processes):
    primary, standby = database_pair
    dsn = await create_database(primary.dsn, DATABASE)
    node_ids = [f"node-{index + 1}" for index in range(3)]
    async with proxies(dsn, len(node_ids)) as stall_proxies:
        nodes = []
        for node_id, proxy in zip(node_ids, stall_proxies, strict=True):
            url = multi_host_dsn(proxy.dsn(dsn) + f"?application_name={node_id}", standby)
            nodes.append(Daemon(url, tmp_path / f"{node_id}.log", node_id=node_id, shards=SHARDS,
                                extra_args=["--shard-lease-ttl", str(LEASE_TTL)]))
        for node in nodes:
            node.start()
            processes.append(node)
        for node in nodes:
            await node.wait_ready()
        records = [tmp_path / f"worker-{index}.jsonl" for index in range(2)]
        workers = []
        for index, record in enumerate(records):
            worker = WorkerProcess("recording_worker:worker", [node.address for node in nodes],
                                   tmp_path / f"worker-{index}.log",
                                   env=child_environment(HERE, FASTLANE_RECORD_FILE=str(record)))
            worker.start()
            processes.append(worker)
            workers.append(worker)

        anchor = datetime.now(UTC) + LEAD_IN
        misfire = MisfirePolicy(kind=MisfireKind.FIRE_ALL, grace=timedelta(seconds=60))
        async with Client(nodes[0].address, timeout=30) as client:
            specs = [JobSpec(name=f"tick-{i}", job_type="e2e", schedule=Schedule.interval(EVERY, anchor),
                             misfire=misfire, lease_ttl=timedelta(seconds=3), retry=RETRY,
                             payload=orjson.dumps({"sleep": HANDLER_SECONDS})) for i in range(JOBS)]
            jobs = [job for job, _ in await asyncio.gather(*(client.create_job(spec) for spec in specs))]
        assert datetime.now(UTC) < anchor, "creating the jobs took longer than the lead-in"

        health = {node.address: HealthLog(node_id) for node, node_id in zip(nodes, node_ids, strict=True)}
        watcher = asyncio.create_task(watch_health(nodes, health), name="health-watch")
        faults: list[Fault] = []
        killed_at: datetime | None = None

        def strike(name: str) -> Fault:
            now = datetime.now(UTC)
            faults.append(Fault(name, struck=now, cleared=now))
            return faults[-1]

        def fired_since(moment: datetime) -> bool:
            return any(datetime.fromisoformat(entry["scheduled_for"]) >= moment
                       for record in records for entry in read_records(record))

        async def settle(fault: Fault) -> None:
            await asyncio.sleep(max(0.0, SETTLE - (datetime.now(UTC) - fault.cleared).total_seconds()))

        try:
            await wait_for(lambda: fired_since(anchor + 2 * EVERY), 30, "the cluster to fire")

            # Just after a tick, while the handlers of its runs are still busy (each takes
            # HANDLER_SECONDS): they are redelivered once their worker leases run out.
            await asyncio.sleep(tick_offset(anchor, 0.05))
            strike("worker SIGKILL, runs in its hands")
            workers[1].kill()
            await settle(faults[-1])

            fault = strike("node SIGSTOP inside a fenced transaction, past its lease")
            fault.note = await freeze_inside_fenced_transaction(dsn, nodes[1], node_ids[1])
            fault.struck = fault.cleared = datetime.now(UTC)
            await asyncio.sleep(LEASE_TTL + 2)
            nodes[1].popen.send_signal(signal.SIGCONT)
            await settle(fault)

            killed_at = strike("node SIGKILL").struck
            nodes[2].kill()
            await settle(faults[-1])

            fault = strike("network to the database stalled (no reset)")
            stall_proxies[0].stall()
            await asyncio.sleep(2.5 * LEASE_TTL)
            stall_proxies[0].resume()
            fault.note = f"stalled {2.5 * LEASE_TTL:g} s"
            await settle(fault)

            fault = strike("PostgreSQL restart -m fast")
            await asyncio.to_thread(primary.restart, "fast")
            fault.cleared = datetime.now(UTC)
            await settle(fault)

            fault = strike("primary killed, synchronous standby promoted")
            await asyncio.to_thread(primary.crash)
            # Longer than a lease, as a failover manager takes a while to decide: every lease
            # runs out meanwhile, and the nodes say NOT_SERVING until the standby is promoted.
            await asyncio.sleep(PROMOTE_AFTER)
            await asyncio.to_thread(standby.promote)
            fault.cleared = datetime.now(UTC)
            fault.note = f"promoted {PROMOTE_AFTER:g} s after the crash"
            await settle(fault)
            # The nodes found the promoted standby by themselves, and knew it for another server.
            changes = [nodes[index].metrics().get("fastlane_database_server_changes_total", 0) for index in (0, 1)]
            assert all(change >= 1 for change in changes), changes
            end = datetime.now(UTC)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

        survivors = [nodes[0], nodes[1]]
        assert not alive(survivors), "\n".join(alive(survivors))
        assert all(health[node.address].serving for node in survivors), "a surviving node is not serving"

        # Every occurrence due until a little before the end, and what the workers did with it.
        until = end - EVERY * 2
        expected = {(job.job_id, anchor + k * EVERY) for job in jobs for k in range(int((until - anchor) / EVERY) + 1)}
        occurrence_of: dict[str, tuple[str, datetime]] = {}
        received_at: dict[tuple[str, datetime], int] = defaultdict(int)
        succeeded: dict[tuple[str, datetime], set[str]] = defaultdict(set)
        started_at: dict[tuple[str, int], datetime] = {}  # (run, attempt) -> its handler started
        first_success: dict[tuple[str, datetime], datetime] = {}  # occurrence -> start of its first success

        def read_outcomes() -> None:
            for found in (occurrence_of, received_at, succeeded, started_at, first_success):
                found.clear()
            for record in records:
                for entry in read_records(record):
                    occurrence = (entry["job_id"], datetime.fromisoformat(entry["scheduled_for"]))
                    occurrence_of[entry["run_id"]] = occurrence
                    received_at[occurrence] += 1
                    started_at[entry["run_id"], entry["attempt"]] = datetime.fromisoformat(entry["received_at"])
            for record in records:
                for event in read_records(Path(f"{record}.events")):
                    if event["event"] == "outcome" and event["result"] == "succeeded":
                        occurrence = occurrence_of[event["run_id"]]
                        succeeded[occurrence].add(event["run_id"])
                        at = started_at[event["run_id"], event["attempt"]]
                        first_success[occurrence] = min(first_success.get(occurrence, at), at)

        def all_succeeded() -> bool:
            read_outcomes()
            return expected <= succeeded.keys()

        with contextlib.suppress(AssertionError):  # the table below says what is missing
            await wait_for(all_succeeded, 30, "every occurrence to succeed", interval=0.5)
        read_outcomes()

        table = []
        baseline = Fault("none (before the first fault)", struck=anchor, cleared=anchor)
        bounds = [anchor] + [fault.struck - EVERY for fault in faults] + [until + EVERY]
        for fault, start, stop in zip([baseline, *faults], bounds[:-1], bounds[1:], strict=True):
            window = {occurrence for occurrence in expected if start <= occurrence[1] < stop}
            gaps = [(first_success[occurrence] - max(occurrence[1], fault.cleared)).total_seconds()
                    for occurrence in window if occurrence in first_success]
            mono_start = time.monotonic() - (datetime.now(UTC) - fault.struck).total_seconds()
            mono_stop = time.monotonic() - (datetime.now(UTC) - min(stop, end)).total_seconds()
            table.append({
                "fault": fault.name,
                "note": fault.note,
                "database_down_s": fault.database_down_s,
                "occurrences": len(window),
                "lost": sum(1 for occurrence in window if occurrence not in succeeded),
                "double_succeeded": sum(1 for occurrence in window if len(succeeded.get(occurrence, ())) > 1),
                "redeliveries": sum(received_at[occurrence] - 1 for occurrence in window if received_at[occurrence] > 1),
                "max_gap_s": round(max(gaps, default=0.0), 3),
                "not_serving_s": {log.name: round(log.not_serving_between(mono_start, mono_stop), 2)
                                  if not (killed_at and log.name == node_ids[2] and killed_at < start) else "killed"
                                  for log in health.values()},
            })
        print("fault table:", orjson.dumps(table).decode())
        if os.environ.get("FASTLANE_CHAOS_REPORT"):
            Path(os.environ["FASTLANE_CHAOS_REPORT"]).write_bytes(orjson.dumps(table, option=orjson.OPT_INDENT_2))

        assert faults[1].note == "idle in transaction", faults[1].note
        for row in table:
            assert row["lost"] == 0, row
            assert row["double_succeeded"] == 0, row
            assert row["max_gap_s"] <= MAX_GAP, row
            assert row["occurrences"] >= JOBS, row  # each fault had a window of its own
