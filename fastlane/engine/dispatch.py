"""Dispatch: ready queues, worker sessions with credits, and the journal of what happened.

A released run goes straight to a connected worker that declared its job type and has a free
credit; otherwise it waits in the ready queue of its type until one does. Sending never waits
for the database: dispatches, heartbeats and results go to a *journal* that one writer task
flushes in batches, in order (a result is never written before its dispatch). A worker's results
are acknowledged only once the batch holding them is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from fastlane.clock import Clock
from fastlane.errors import StorageError
from fastlane.metrics import Metrics
from fastlane.models import Delivery, Run, RunState
from fastlane.storage import AttemptResult, Dispatch, Heartbeat, Store

log = logging.getLogger("fastlane.dispatch")

JOURNAL_RETRY = timedelta(milliseconds=200)
DEFAULT_LEASE_TTL = timedelta(seconds=30)  # for attempts sent by an earlier incarnation of the node


@dataclass(frozen=True, slots=True)
class Assigned:
    """One run sent to a worker as a new attempt."""

    run: Run
    attempt: int
    lease_token: int
    released_at: datetime


@dataclass(frozen=True, slots=True)
class AttemptRef:
    run_id: str
    lease_token: int


@dataclass(frozen=True, slots=True)
class Assign:
    runs: list[Assigned]


@dataclass(frozen=True, slots=True)
class Acknowledge:
    results: list[AttemptRef]


@dataclass(frozen=True, slots=True)
class Cancel:
    attempts: list[AttemptRef]
    reason: str


Outgoing = Assign | Acknowledge | Cancel


@dataclass(eq=False)
class WorkerSession:
    """One connected worker stream. ``outbox`` is drained by the gRPC servicer."""

    worker_id: str
    job_types: frozenset[str]
    tenant: str | None
    credits: int
    outbox: asyncio.Queue[Outgoing] = field(default_factory=asyncio.Queue)
    connected: bool = True


@dataclass
class _Journal:
    dispatches: list[Dispatch] = field(default_factory=list)
    heartbeats: dict[tuple[str, int], tuple[WorkerSession, Heartbeat]] = field(default_factory=dict)
    results: list[tuple[WorkerSession, AttemptResult]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.dispatches or self.heartbeats or self.results)


class Dispatcher:
    """Matches released runs with worker credits and journals every attempt."""

    def __init__(
        self,
        store: Store,
        *,
        node_id: str,
        clock: Clock,
        metrics: Metrics,
        reschedule: Callable[[Run], None],
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._clock = clock
        self._metrics = metrics
        self._reschedule = reschedule
        self._sessions: dict[str, list[WorkerSession]] = {}  # by job type, rotated for fairness
        self._ready: dict[str, deque[Run]] = {}
        self._journal = _Journal()
        self._journal_ready = asyncio.Event()
        self._journal_idle = asyncio.Event()
        self._journal_idle.set()
        self._stopping = False
        # Lease tokens only need to differ between attempts of one run; a random start keeps
        # two node incarnations from reusing the same sequence.
        self._tokens = itertools.count(random.getrandbits(40) << 20)
        # Attempts sent and not yet reported, with the session holding each and its lease TTL.
        self._in_flight: dict[tuple[str, int], tuple[WorkerSession, timedelta]] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- sessions -------------------------------------------------------------------------------

    @property
    def workers_connected(self) -> int:
        return len({id(s) for sessions in self._sessions.values() for s in sessions})

    @property
    def ready_depth(self) -> int:
        return sum(len(queue) for queue in self._ready.values())

    def connect(self, worker_id: str, job_types: Iterable[str], credits: int, tenant: str | None) -> WorkerSession:
        session = WorkerSession(worker_id=worker_id, job_types=frozenset(job_types), tenant=tenant or None,
                                credits=max(credits, 0))
        for job_type in session.job_types:
            self._sessions.setdefault(job_type, []).append(session)
        self._metrics.workers.set(self.workers_connected)
        log.info("worker %s connected for %s with %d credits", worker_id, sorted(session.job_types), credits)
        self._assign_ready(session)
        return session

    def disconnect(self, session: WorkerSession) -> None:
        # Its attempts keep their leases: the worker may reconnect and report them, and if it
        # does not, the leases expire and the runs are delivered again.
        session.connected = False
        self._in_flight = {key: held for key, held in self._in_flight.items() if held[0] is not session}
        for job_type in session.job_types:
            sessions = self._sessions.get(job_type, [])
            if session in sessions:
                sessions.remove(session)
            if not sessions:
                self._sessions.pop(job_type, None)
        self._metrics.workers.set(self.workers_connected)
        log.info("worker %s disconnected", session.worker_id)

    def grant(self, session: WorkerSession, credits: int) -> None:
        session.credits += max(credits, 0)
        self._assign_ready(session)

    # -- runs -----------------------------------------------------------------------------------

    def release(self, runs: list[Run]) -> None:
        """Hand due runs to workers with credits; queue the rest."""
        now = self._clock.now()
        batches: dict[int, tuple[WorkerSession, list[Assigned]]] = {}
        for run in runs:
            session = self._pick(run)
            if session is None:
                self._ready.setdefault(run.job_type, deque()).append(run)
                continue
            batches.setdefault(id(session), (session, []))[1].append(self._assign(session, run, now))
        for session, assigned in batches.values():
            self._send(session, assigned)
        self._metrics.ready_queue.set(self.ready_depth)

    def _send(self, session: WorkerSession, assigned: list[Assigned]) -> None:
        """At-least-once runs go at once; at-most-once runs only after their start is durable."""
        at_least_once = [item for item in assigned if item.run.delivery is Delivery.AT_LEAST_ONCE]
        at_most_once = [item for item in assigned if item.run.delivery is Delivery.AT_MOST_ONCE]
        if at_least_once:
            for item in at_least_once:
                self._journal.dispatches.append(self._dispatch_record(session, item))
            self._wake_journal()
            session.outbox.put_nowait(Assign(at_least_once))
        if at_most_once:
            task = asyncio.create_task(self._send_at_most_once(session, at_most_once), name="dispatch-at-most-once")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _send_at_most_once(self, session: WorkerSession, assigned: list[Assigned]) -> None:
        try:
            recorded = await self._store.record_dispatches([self._dispatch_record(session, item) for item in assigned])
        except StorageError as error:
            log.warning("could not record %d at-most-once dispatches; queueing them again: %s", len(assigned), error)
            recorded = []
        started = {attempt.run_id for attempt in recorded}
        sendable = [item for item in assigned if item.run.run_id in started]
        for item in assigned:
            if item.run.run_id not in started:
                self._in_flight.pop((item.run.run_id, item.lease_token), None)
                session.credits += 1
        # A run not recorded is either already started elsewhere (never send it twice) or the
        # write failed (it is still scheduled in the database and comes back on the next rebuild).
        if sendable and session.connected:
            session.outbox.put_nowait(Assign(sendable))

    def _dispatch_record(self, session: WorkerSession, item: Assigned) -> Dispatch:
        return Dispatch(
            run_id=item.run.run_id, lease_token=item.lease_token, worker_id=session.worker_id, node_id=self._node_id,
            lease_ttl=item.run.lease_ttl, dispatched_at=item.released_at,
        )

    def cancel(self, runs: Iterable[Run]) -> None:
        """Stop these runs: drop them from the ready queues, tell the workers holding them."""
        by_session: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        for run in runs:
            queue = self._ready.get(run.job_type)
            if queue:
                self._ready[run.job_type] = deque(queued for queued in queue if queued.run_id != run.run_id)
            if run.lease_token is None:
                continue
            held = self._in_flight.get((run.run_id, run.lease_token))
            if held is not None and held[0].connected:
                by_session.setdefault(id(held[0]), (held[0], []))[1].append(AttemptRef(run.run_id, run.lease_token))
        for session, refs in by_session.values():
            session.outbox.put_nowait(Cancel(refs, "the run was cancelled"))
        self._metrics.ready_queue.set(self.ready_depth)

    def drop_shards(self, shard_ids: Iterable[int]) -> None:
        """Forget queued runs of shards this node lost; their new owner delivers them."""
        lost = set(shard_ids)
        for job_type, queue in list(self._ready.items()):
            kept = deque(run for run in queue if run.shard_id not in lost)
            self._ready[job_type] = kept
        self._metrics.ready_queue.set(self.ready_depth)

    def _pick(self, run: Run) -> WorkerSession | None:
        sessions = self._sessions.get(run.job_type)
        if not sessions:
            return None
        for _ in range(len(sessions)):
            session = sessions[0]
            sessions.append(sessions.pop(0)) if len(sessions) > 1 else None
            if session.credits > 0 and (session.tenant is None or session.tenant == run.tenant):
                return session
        return None

    def _assign(self, session: WorkerSession, run: Run, now: datetime) -> Assigned:
        session.credits -= 1
        token = next(self._tokens)
        self._in_flight[(run.run_id, token)] = (session, run.lease_ttl)
        self._metrics.dispatch_lag.observe(max((now - run.available_at).total_seconds(), 0.0))
        return Assigned(run=run, attempt=run.attempts + 1, lease_token=token, released_at=now)

    def _assign_ready(self, session: WorkerSession) -> None:
        now = self._clock.now()
        assigned: list[Assigned] = []
        for job_type in session.job_types:
            queue = self._ready.get(job_type)
            skipped: deque[Run] = deque()
            while queue and session.credits > 0:
                run = queue.popleft()
                if session.tenant is not None and run.tenant != session.tenant:
                    skipped.append(run)
                    continue
                assigned.append(self._assign(session, run, now))
            if queue is not None:
                queue.extendleft(reversed(skipped))
        if assigned:
            self._send(session, assigned)
            self._metrics.ready_queue.set(self.ready_depth)

    # -- what workers report --------------------------------------------------------------------

    def heartbeats(self, session: WorkerSession, beats: Iterable[Heartbeat]) -> None:
        """Journal heartbeats; each extends its lease by the TTL the attempt was sent with."""
        for beat in beats:
            key = (beat.run_id, beat.lease_token)
            _, ttl = self._in_flight.get(key, (session, DEFAULT_LEASE_TTL))
            self._journal.heartbeats[key] = (session, replace(beat, lease_ttl=ttl))
        self._wake_journal()

    def results(self, session: WorkerSession, results: Iterable[AttemptResult]) -> None:
        for result in results:
            self._in_flight.pop((result.run_id, result.lease_token), None)
            self._journal.results.append((session, result))
        self._wake_journal()

    def _wake_journal(self) -> None:
        self._journal_idle.clear()
        self._journal_ready.set()

    # -- the journal writer ---------------------------------------------------------------------

    async def run(self) -> None:
        """Flush the journal until stopped; every batch is one round of durable writes."""
        while True:
            await self._journal_ready.wait()
            self._journal_ready.clear()
            if not self._journal:
                self._journal_idle.set()
                if self._stopping:
                    return
                continue
            batch, self._journal = self._journal, _Journal()
            try:
                await self._write(batch)
            except StorageError as error:
                log.warning("journal write failed, retrying: %s", error)
                self._requeue(batch)
                await asyncio.sleep(JOURNAL_RETRY.total_seconds())
            if not self._journal:
                self._journal_idle.set()
            else:
                self._journal_ready.set()

    async def flush(self, timeout: float) -> None:
        """Wait until everything journalled so far is durable (or the timeout passes)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._journal_idle.wait()

    def stop(self) -> None:
        self._stopping = True
        self._journal_ready.set()

    def _requeue(self, batch: _Journal) -> None:
        batch.dispatches.extend(self._journal.dispatches)
        batch.heartbeats.update(self._journal.heartbeats)
        batch.results.extend(self._journal.results)
        self._journal = batch

    async def _write(self, batch: _Journal) -> None:
        if batch.dispatches:
            await self._store.record_dispatches(batch.dispatches)
            batch.dispatches = []  # durable: not written again if a later step fails
        if batch.heartbeats:
            beats = list(batch.heartbeats.values())
            stale = set(await self._store.record_heartbeats([beat for _, beat in beats]))
            batch.heartbeats = {}
            self._cancel_stale(beats, stale)
        if batch.results:
            results = batch.results
            outcomes = await self._store.record_results([result for _, result in results])
            batch.results = []
            self._settle(results, outcomes)

    def _cancel_stale(self, beats: list[tuple[WorkerSession, Heartbeat]], stale: set[str]) -> None:
        by_session: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        for session, beat in beats:
            if beat.run_id in stale:
                by_session.setdefault(id(session), (session, []))[1].append(AttemptRef(beat.run_id, beat.lease_token))
        for session, refs in by_session.values():
            if session.connected:
                session.outbox.put_nowait(Cancel(refs, "the attempt's lease is no longer current"))

    def _settle(self, results: list[tuple[WorkerSession, AttemptResult]], outcomes: list) -> None:  # type: ignore[type-arg]
        acks: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        for session, result in results:
            acks.setdefault(id(session), (session, []))[1].append(AttemptRef(result.run_id, result.lease_token))
        for session, refs in acks.values():
            if session.connected:
                session.outbox.put_nowait(Acknowledge(refs))
        for outcome in outcomes:
            if not outcome.accepted:
                self._metrics.runs.labels(outcome="superseded").inc()
                continue
            run: Run = outcome.run
            self._metrics.runs.labels(outcome="retry" if run.state is RunState.SCHEDULED else run.state.value).inc()
            if run.state is RunState.SCHEDULED:
                self._reschedule(run)
