"""Dispatch: ready queues, worker sessions with credits, and the journal of what happened.

A released run goes straight to a connected worker that declared its job type and has a free
credit; otherwise it waits in the ready queue of its type until one does.

Two ways to send:

- *fast*: the run was written by this node a moment ago (or triggered, or retried through it),
  so no one else can hold it. It is sent at once; its dispatch goes to a *journal* that one
  writer task flushes in batches, in order (a result is never written before its dispatch).
- *confirmed*: the run came back from the database (a rebuild, an expired lease) or is
  at-most-once. Its dispatch is written first and it is sent only if that write took it from
  ``scheduled`` — the database, not memory, decides that nobody else has it.

A run is *claimed* from the moment it is assigned until its dispatch is durable; a second
release of a claimed run is dropped. Results are acknowledged to the worker only once durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from fastlane.clock import Clock
from fastlane.errors import StorageError
from fastlane.metrics import Metrics
from fastlane.models import Delivery, Run, RunState
from fastlane.storage import AttemptResult, Dispatch, Heartbeat, ResultOutcome, Store

log = logging.getLogger("fastlane.dispatch")

JOURNAL_RETRY = timedelta(milliseconds=200)


@dataclass(frozen=True, slots=True)
class Assigned:
    """One run sent to a worker as a new attempt."""

    run: Run
    attempt: int
    lease_token: int
    released_at: datetime
    confirm_first: bool


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


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A run in a ready queue, and how it must be sent."""

    run: Run
    confirm_first: bool


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
        self._ready: dict[str, deque[_Waiting]] = {}
        self._queued: set[str] = set()  # run ids in the ready queues
        self._journal = _Journal()
        self._journal_ready = asyncio.Event()
        self._journal_idle = asyncio.Event()
        self._journal_idle.set()
        self._stopping = False
        self._assigning = True
        # Lease tokens only need to differ between attempts of one run; a random start keeps
        # two node incarnations from reusing the same sequence.
        self._tokens = itertools.count(random.getrandbits(40) << 20)
        self._claimed: set[str] = set()  # runs assigned whose dispatch is not yet durable
        self._in_flight: dict[tuple[str, int], WorkerSession] = {}  # attempts sent, not yet reported
        self._background: set[asyncio.Task[None]] = set()
        metrics.ready_queue.set_function(lambda: self.ready_depth)  # read when scraped

    # -- sessions -------------------------------------------------------------------------------

    @property
    def workers_connected(self) -> int:
        return len({id(s) for sessions in self._sessions.values() for s in sessions})

    @property
    def ready_depth(self) -> int:
        # Also read by the metrics thread: list() takes the queues in one step under the GIL,
        # so a queue added meanwhile cannot break the iteration.
        return sum(map(len, list(self._ready.values())))

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
        self._in_flight = {key: held for key, held in self._in_flight.items() if held is not session}
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

    def release(self, runs: Iterable[Run], *, confirm_first: bool = False) -> None:
        """Hand due runs to workers with credits; queue the rest.

        ``confirm_first``: the runs came from the database, not from this node's own writes,
        so each is sent only once its dispatch has durably taken it from ``scheduled``.
        """
        now = self._clock.now()
        batches: dict[int, tuple[WorkerSession, list[Assigned]]] = {}
        for run in runs:
            if run.run_id in self._claimed:
                continue
            session = self._pick(run) if self._assigning else None
            if session is None:
                if run.run_id not in self._queued:
                    self._queued.add(run.run_id)
                    self._ready.setdefault(run.job_type, deque()).append(_Waiting(run, confirm_first))
                continue
            batches.setdefault(id(session), (session, []))[1].append(self._assign(session, run, now, confirm_first))
        for session, assigned in batches.values():
            self._send(session, assigned)

    def holds(self, run_id: str) -> bool:
        """Whether this run is queued here or being dispatched (so must not be released again)."""
        return run_id in self._queued or run_id in self._claimed

    def stop_assigning(self) -> None:
        """Shutting down: keep everything that is not yet sent for the successor."""
        self._assigning = False

    def cancel(self, runs: Iterable[Run]) -> None:
        """Stop these runs: drop them from the ready queues, tell the workers holding them."""
        by_session: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        cancelled = {run.run_id for run in runs}
        self._drop_queued(lambda queued: queued.run_id in cancelled)
        # By (run, token) rather than the run's stored token: an attempt sent a moment ago may
        # not be recorded yet.
        for (run_id, token), session in self._in_flight.items():
            if run_id in cancelled and session.connected:
                by_session.setdefault(id(session), (session, []))[1].append(AttemptRef(run_id, token))
        for session, refs in by_session.values():
            session.outbox.put_nowait(Cancel(refs, "the run was cancelled"))

    def forget_job(self, job_id: str) -> None:
        """The job was deleted: its queued runs were cancelled in the database."""
        self._drop_queued(lambda queued: queued.job_id == job_id)

    def drop_shards(self, shard_ids: Iterable[int]) -> None:
        """Forget queued runs of shards this node lost; their new owner delivers them."""
        lost = set(shard_ids)
        self._drop_queued(lambda queued: queued.shard_id in lost)

    def forget_attempts(self, runs: Iterable[Run]) -> None:
        """These runs' earlier attempts expired: no result for them will be waited for."""
        expired = {run.run_id for run in runs}
        self._in_flight = {key: held for key, held in self._in_flight.items() if key[0] not in expired}

    def _drop_queued(self, matches: Callable[[Run], bool]) -> None:
        for job_type, queue in list(self._ready.items()):
            self._ready[job_type] = deque(waiting for waiting in queue if not matches(waiting.run))
        self._queued = {waiting.run.run_id for queue in self._ready.values() for waiting in queue}

    def _pick(self, run: Run) -> WorkerSession | None:
        sessions = self._sessions.get(run.job_type)
        if not sessions:
            return None
        for _ in range(len(sessions)):
            session = sessions[0]
            if len(sessions) > 1:
                sessions.append(sessions.pop(0))
            if session.credits > 0 and (session.tenant is None or session.tenant == run.tenant):
                return session
        return None

    def _assign(self, session: WorkerSession, run: Run, now: datetime, confirm_first: bool) -> Assigned:
        session.credits -= 1
        token = next(self._tokens)
        self._claimed.add(run.run_id)
        self._in_flight[(run.run_id, token)] = session
        self._metrics.dispatch_lag.observe(max((now - run.available_at).total_seconds(), 0.0))
        confirm = confirm_first or run.delivery is Delivery.AT_MOST_ONCE
        return Assigned(run=run, attempt=run.attempts + 1, lease_token=token, released_at=now, confirm_first=confirm)

    def _assign_ready(self, session: WorkerSession) -> None:
        if not self._assigning:
            return
        now = self._clock.now()
        assigned: list[Assigned] = []
        for job_type in session.job_types:
            queue = self._ready.get(job_type)
            skipped: deque[_Waiting] = deque()
            while queue and session.credits > 0:
                waiting = queue.popleft()
                self._queued.discard(waiting.run.run_id)
                if waiting.run.run_id in self._claimed:
                    continue
                if session.tenant is not None and waiting.run.tenant != session.tenant:
                    self._queued.add(waiting.run.run_id)
                    skipped.append(waiting)
                    continue
                assigned.append(self._assign(session, waiting.run, now, waiting.confirm_first))
            if queue is not None:
                queue.extendleft(reversed(skipped))
        if assigned:
            self._send(session, assigned)

    def _send(self, session: WorkerSession, assigned: list[Assigned]) -> None:
        fast = [item for item in assigned if not item.confirm_first]
        confirmed = [item for item in assigned if item.confirm_first]
        if fast:
            self._journal.dispatches.extend(self._dispatch_record(session, item) for item in fast)
            self._wake_journal()
            session.outbox.put_nowait(Assign(fast))
        if confirmed:
            task = asyncio.create_task(self._send_confirmed(session, confirmed), name="dispatch-confirmed")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _send_confirmed(self, session: WorkerSession, assigned: list[Assigned]) -> None:
        try:
            recorded = await self._store.record_dispatches([self._dispatch_record(session, item) for item in assigned])
        except StorageError as error:
            # Still scheduled in the database: the next rebuild or sweep brings them back.
            log.warning("could not record %d dispatches before sending; not sent: %s", len(assigned), error)
            recorded = []
        started = {attempt.run_id for attempt in recorded}
        for item in assigned:
            self._claimed.discard(item.run.run_id)
            if item.run.run_id not in started:
                # Already taken by another attempt (or the write failed): never sent twice.
                self._in_flight.pop((item.run.run_id, item.lease_token), None)
                session.credits += 1
        sendable = [item for item in assigned if item.run.run_id in started]
        if sendable and session.connected:
            session.outbox.put_nowait(Assign(sendable))

    def _dispatch_record(self, session: WorkerSession, item: Assigned) -> Dispatch:
        return Dispatch(
            run_id=item.run.run_id, lease_token=item.lease_token, worker_id=session.worker_id, node_id=self._node_id,
            lease_ttl=item.run.lease_ttl, dispatched_at=item.released_at,
        )

    # -- what workers report --------------------------------------------------------------------

    def heartbeats(self, session: WorkerSession, beats: Iterable[Heartbeat]) -> None:
        for beat in beats:
            self._journal.heartbeats[(beat.run_id, beat.lease_token)] = (session, beat)
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
        """Flush the journal until stopped and drained; every batch is one round of durable writes."""
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
            self._journal_ready.set()  # loop once more: returns if stopping and drained

    async def flush(self, timeout: float) -> None:
        """Wait until everything journalled so far is durable (or the timeout passes)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._journal_idle.wait()

    def stop(self) -> None:
        """Let :meth:`run` return once the journal is drained."""
        self._stopping = True
        self._journal_ready.set()

    def _requeue(self, batch: _Journal) -> None:
        batch.dispatches.extend(self._journal.dispatches)
        batch.heartbeats.update(self._journal.heartbeats)
        batch.results.extend(self._journal.results)
        self._journal = batch

    async def _write(self, batch: _Journal) -> None:
        if batch.dispatches:
            recorded = {attempt.run_id for attempt in await self._store.record_dispatches(batch.dispatches)}
            for dispatch in batch.dispatches:
                self._claimed.discard(dispatch.run_id)
            self._withdraw([d for d in batch.dispatches if d.run_id not in recorded])
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

    def _withdraw(self, dispatches: list[Dispatch]) -> None:
        """Sent, but the database did not take the run from ``scheduled`` (it was cancelled or
        another attempt has it in the moment between): tell the worker to stop it."""
        by_session: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        for dispatch in dispatches:
            session = self._in_flight.pop((dispatch.run_id, dispatch.lease_token), None)
            if session is not None and session.connected:
                by_session.setdefault(id(session), (session, []))[1].append(
                    AttemptRef(dispatch.run_id, dispatch.lease_token))
        for session, refs in by_session.values():
            log.info("withdrawing %d runs from worker %s: no longer scheduled", len(refs), session.worker_id)
            session.outbox.put_nowait(Cancel(refs, "the run was cancelled before its dispatch was recorded"))

    def _cancel_stale(self, beats: list[tuple[WorkerSession, Heartbeat]], stale: set[str]) -> None:
        by_session: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        for session, beat in beats:
            if beat.run_id in stale:
                by_session.setdefault(id(session), (session, []))[1].append(AttemptRef(beat.run_id, beat.lease_token))
        for session, refs in by_session.values():
            if session.connected:
                session.outbox.put_nowait(Cancel(refs, "the attempt's lease is no longer current"))

    def _settle(self, results: list[tuple[WorkerSession, AttemptResult]], outcomes: list[ResultOutcome]) -> None:
        acks: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        for session, result in results:
            acks.setdefault(id(session), (session, []))[1].append(AttemptRef(result.run_id, result.lease_token))
        for session, refs in acks.values():
            if session.connected:
                session.outbox.put_nowait(Acknowledge(refs))
        counted: Counter[str] = Counter()  # one metric update per outcome kind and batch
        for outcome in outcomes:
            if not outcome.accepted:
                counted["superseded"] += 1
                continue
            state = outcome.state
            if outcome.released:
                counted["released_from_buffer"] += 1
            elif state is RunState.SCHEDULED:
                counted["retry"] += 1
            else:
                counted[state.value] += 1
            if state is RunState.SCHEDULED:
                self._reschedule(outcome.run)
        for kind, count in counted.items():
            self._metrics.runs.labels(outcome=kind).inc(count)
