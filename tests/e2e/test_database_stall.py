"""A network that hangs: a node whose database stops answering (no reset, no error) stops firing
before its shard leases can expire, says NOT_SERVING, and comes back when the network does.

The node reaches PostgreSQL through :class:`stall_proxy.StallProxy`. The test stalls the proxy
for 2.5 lease TTLs: every packet in flight stays in flight and every call waits, until a client
timeout, if any. By the database's clock the node's leases run out at the latest one TTL after
the stall began (the last renewal the database could have seen was sent before), and another
node may then fire those shards: so nothing may reach the worker from then until the stall
ends. The worker's own records say what it received and when.

Occurrences due every 100 ms stop by themselves soon after the stall begins, as their runs are
written only a short lead ahead and writing needs the database. What a node holds in memory
past that is retries: runs already written, released at their retry time without a round trip.
So jobs fail their first attempt just before the stall and are retried after a random delay of
up to 7 s: many of those retries fall due after the lease could have expired, and only the
node's local lease deadline keeps them from being sent then.

The test prints a report (``database stall report: {...}``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import grpc
import orjson
import pytest
from e2e_support import Recorder, recorded_events, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc
from stall_proxy import StallProxy

from fastlane.client import Client
from fastlane.domain.models import JobSpec, RetryPolicy, Schedule
from fastlane.testing.processes import Daemon

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.postgres]

LEASE_TTL = 3.0  # seconds
STALL = 2.5 * LEASE_TTL
EVERY = timedelta(milliseconds=100)
JOBS = 4  # spread over shards, each due every EVERY
SHARDS = 8
LEAD_IN = timedelta(seconds=3)  # before the first occurrence: time to create the jobs
BEFORE_STALL = 3.0  # seconds of normal firing before the stall
BACK_IN_SERVICE_WITHIN = 10.0  # seconds after the stall ends (a lease cycle is TTL/3)
AFTER = 4.0  # seconds of firing after the node serves again
RETRIED = 24  # jobs that fail their first attempt just before the stall
FAIL_BEFORE_STALL = timedelta(seconds=1.2)  # their first attempt, before the stall begins
RETRY = RetryPolicy(max_attempts=3, backoff_base=timedelta(seconds=7), backoff_cap=timedelta(seconds=7))


async def serving(channel: grpc.aio.Channel) -> bool:
    """Whether the node says SERVING; a node that does not answer is not serving."""
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
    except grpc.aio.AioRpcError:
        return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


async def watch_health(channel: grpc.aio.Channel, transitions: list[tuple[float, bool]]) -> None:
    """Note every change of the node's health, as (monotonic time, serving), every 50 ms."""
    while True:
        state = await serving(channel)
        if not transitions or transitions[-1][1] != state:
            transitions.append((time.monotonic(), state))
        await asyncio.sleep(0.05)


async def succeeded_attempts_per_run(dsn: str) -> dict[str, int]:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT run_id, count(*) AS n FROM attempts WHERE outcome = 'succeeded' GROUP BY run_id"
        )
    finally:
        await connection.close()
    return {row["run_id"]: row["n"] for row in rows}


@pytest.mark.timeout(120)
async def test_a_node_whose_database_hangs_stops_firing_before_its_lease_expires(pg_dsn, tmp_path: Path, processes):
    proxy = await StallProxy.for_dsn(pg_dsn).start()
    try:
        node = Daemon(proxy.dsn(pg_dsn), tmp_path / "node.log", shards=SHARDS,
                      extra_args=["--shard-lease-ttl", str(LEASE_TTL)])
        node.start()
        processes.append(node)
        await node.wait_ready()
        worker = Recorder(node.address, tmp_path / "received.jsonl", tmp_path / "worker.log")
        worker.start()
        processes.append(worker)

        transitions: list[tuple[float, bool]] = []
        channel = grpc.aio.insecure_channel(node.address)
        watcher = asyncio.create_task(watch_health(channel, transitions), name="health-watch")
        try:
            anchor = datetime.now(UTC) + LEAD_IN
            async with Client(node.address, timeout=30) as client:
                jobs = [
                    await client.create_job(JobSpec(name=f"tick-{i}", job_type="e2e",
                                                    schedule=Schedule.interval(EVERY, anchor + i * EVERY / JOBS)))
                    for i in range(JOBS)
                ]
                await wait_for(lambda: len(worker.received()) >= 10 * JOBS, 20, "the jobs to fire")
                await asyncio.sleep(BEFORE_STALL)
                stall_planned = datetime.now(UTC) + timedelta(seconds=2)
                payload = orjson.dumps({"fail_until_attempt": 2})
                retried = [
                    await client.create_job(JobSpec(name=f"retried-{i}", job_type="e2e", payload=payload,
                                                    retry=RETRY, schedule=Schedule.at_instant(stall_planned - FAIL_BEFORE_STALL)))
                    for i in range(RETRIED)
                ]
            assert datetime.now(UTC) < stall_planned - FAIL_BEFORE_STALL, "creating the retried jobs took too long"
            retried_ids = {job.job_id for job, _ in retried}
            job_ids = {job.job_id for job, _ in jobs} | retried_ids
            await asyncio.sleep((stall_planned - datetime.now(UTC)).total_seconds())
            first_attempts = {e["job_id"] for e in worker.received() if e["job_id"] in retried_ids}
            assert len(first_attempts) == RETRIED, f"only {len(first_attempts)} retried jobs ran before the stall"
            assert transitions and transitions[-1][1], f"not SERVING before the stall: {transitions}"
            proxy.stall()
            stalled_at, wall_stalled = time.monotonic(), datetime.now(UTC)
            await asyncio.sleep(STALL)
            assert node.popen is not None and node.popen.poll() is None, node.log_tail()
            proxy.resume()
            resumed_at, wall_resumed = time.monotonic(), datetime.now(UTC)

            def back() -> bool:
                assert node.popen is not None and node.popen.poll() is None, node.log_tail()
                return bool(transitions) and transitions[-1][1] and transitions[-1][0] >= resumed_at

            await wait_for(back, BACK_IN_SERVICE_WITHIN, "the node to say SERVING after the stall")
            serving_again = transitions[-1][0] - resumed_at
            await asyncio.sleep(AFTER)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await channel.close()

        records = [entry for entry in worker.received() if entry["job_id"] in job_ids]

        def at(entry: dict, key: str) -> datetime:
            return datetime.fromisoformat(entry[key])

        # 1. Nothing delivered while the lease may belong to someone else. By the database's clock
        # the lease ends at the latest TTL after the stall began; the node's own deadline is a margin
        # (min(1 s, TTL/10) = 0.3 s) earlier, which covers the few milliseconds a run takes from the
        # node to the worker's handler: no further allowance is needed.
        lease_gone = wall_stalled + timedelta(seconds=LEASE_TTL)
        during = [e for e in records if lease_gone < min(at(e, "assignment_received_at"), at(e, "received_at")) < wall_resumed]
        last_before = max((at(e, "assignment_received_at") for e in records
                           if at(e, "assignment_received_at") < wall_resumed), default=wall_stalled)
        report = {
            "lease_ttl_s": LEASE_TTL,
            "stall_s": STALL,
            "last_delivery_after_stall_start_s": round((last_before - wall_stalled).total_seconds(), 3),
            "deliveries_past_lease": len(during),
        }

        # 2. NOT_SERVING during the stall, from no later than the lease's end until the stall's end.
        down = [at_ for at_, state in transitions if not state and stalled_at <= at_ <= resumed_at]
        assert down, f"the node never said NOT_SERVING during the stall: {transitions}"
        report["not_serving_after_stall_start_s"] = round(down[0] - stalled_at, 3)
        report["serving_again_after_resume_s"] = round(serving_again, 3)

        # 3. Every occurrence due until shortly after the node came back was fired (the default
        # misfire policy fires occurrences found less than its 10 s grace late), and none twice.
        first_at: dict[tuple[str, datetime], datetime] = {}
        runs_of: dict[tuple[str, datetime], set[str]] = defaultdict(set)
        for entry in records:
            key = (entry["job_id"], at(entry, "scheduled_for"))
            first_at[key] = min(first_at.get(key, at(entry, "received_at")), at(entry, "received_at"))
            runs_of[key].add(entry["run_id"])
        until = wall_resumed + timedelta(seconds=serving_again + 1)
        expected = set()
        for job, _ in retried:
            assert job.spec.schedule.at is not None
            expected.add((job.job_id, job.spec.schedule.at))
        for job, _ in jobs:
            moment = job.spec.schedule.anchor
            assert moment is not None
            while moment <= until:
                expected.add((job.job_id, moment))
                moment += EVERY
        missing = sorted(expected - set(first_at), key=lambda key: key[1])
        stall_occurrences = [key for key in expected if wall_stalled <= key[1] <= wall_resumed]
        report["occurrences_due_in_stall"] = len(stall_occurrences)
        report["worst_lateness_s"] = round(max(
            (first_at[key] - key[1]).total_seconds() for key in stall_occurrences if key in first_at
        ), 3) if stall_occurrences else 0.0
        retries = [e for e in records if e["job_id"] in retried_ids and e["attempt"] == 2]
        report["retries_delivered_before_lease_end"] = sum(at(e, "assignment_received_at") <= lease_gone for e in retries)
        report["retries_delivered_after_stall"] = sum(at(e, "assignment_received_at") >= wall_resumed for e in retries)
        report["redeliveries"] = sum(n - 1 for n in Counter((e["run_id"], e["attempt"]) for e in records).values())
        print(f"database stall report: {orjson.dumps(report).decode()}")

        assert not during, (
            f"{len(during)} runs reached the worker after the lease could have expired "
            f"({lease_gone.isoformat()}) and before the stall ended ({wall_resumed.isoformat()}): "
            f"{[(e['scheduled_for'], e['assignment_received_at']) for e in during[:5]]}"
        )
        assert down[0] <= stalled_at + LEASE_TTL + 0.5, f"NOT_SERVING only {down[0] - stalled_at:.2f} s into the stall"
        assert not [at_ for at_, state in transitions if state and down[0] < at_ < resumed_at], (
            f"SERVING again during the stall: {transitions}"
        )
        assert not missing, f"{len(missing)} occurrences never fired, first {missing[:3]}"

        def retried_succeeded() -> bool:
            done = {e["job_id"] for e in recorded_events(worker, event="outcome") if e["result"] == "succeeded"}
            return retried_ids <= done

        await wait_for(retried_succeeded, 15, "every retried job to succeed at last")

        def succeeded_runs() -> dict[tuple[str, datetime], set[str]]:
            outcomes = {e["run_id"] for e in recorded_events(worker, event="outcome") if e["result"] == "succeeded"}
            return {key: runs & outcomes for key, runs in runs_of.items()}

        doubled = {key: runs for key, runs in succeeded_runs().items() if len(runs) > 1}
        assert not doubled, f"occurrences with two succeeded runs: {list(doubled.items())[:3]}"
        twice = {run_id: n for run_id, n in (await succeeded_attempts_per_run(pg_dsn)).items() if n > 1}
        assert not twice, f"runs with two succeeded attempts in history: {list(twice.items())[:3]}"
        assert node.popen is not None and node.popen.poll() is None, node.log_tail()
    finally:
        # While the database is still reachable through the proxy (which runs on this loop: the
        # waits go to a thread), so the worker's results are acknowledged and the node's journal
        # lands, and both stop at once.
        for process in reversed(processes):
            await asyncio.to_thread(process.stop)
        await proxy.close()
