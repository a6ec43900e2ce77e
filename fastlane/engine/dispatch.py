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

Guards, so that one worker or one record cannot harm the rest:

- A heartbeat or result counts only from the worker its attempt was sent to (lease tokens are
  random, and checked against the attempt's ``worker_id``); others are refused and logged.
- A journal write that fails for any reason but the database being unreachable is split until
  the record that makes it fail is found; that one is set aside, the rest land.
- The ready queue of a job type holds at most ``max_ready_per_type`` runs and
  ``max_ready_bytes_per_type`` bytes of payload (at least one run). Beyond it a run is
  *parked*: only its id stays in memory (the run itself is ``scheduled`` in the database already)
  and it is read back, oldest first, as workers take runs from the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import struct
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from fastlane.clock import Clock
from fastlane.domain.models import Attempt, Delivery, Run, RunState
from fastlane.errors import StorageError, StorageUnavailable
from fastlane.metrics import Metrics
from fastlane.storage import AttemptResult, Dispatch, Heartbeat, ResultOutcome, Store

log = logging.getLogger("fastlane.dispatch")

JOURNAL_RETRY = timedelta(milliseconds=200)  # the first retry of an unavailable database
JOURNAL_RETRY_CAP = timedelta(seconds=5)  # doubling up to this
# Once stopping, the journal tries this long to make what it holds durable, then gives up (the
# node waits a little longer than this for it): a node must stop while its database is down.
JOURNAL_STOP_GRACE = timedelta(seconds=4)
# A whole crowd of small runs (the write-ahead holds up to 150,000) is sent from memory; large
# payloads are bounded by bytes instead (a 1 MiB payload every 0.1 s fills 64 MiB in 6 s).
DEFAULT_MAX_READY_PER_TYPE = 150_000
DEFAULT_MAX_READY_BYTES_PER_TYPE = 64 << 20
MAX_LEASE_TOKEN = (1 << 63) - 1  # lease_token columns are signed 64-bit integers
RELOAD_BATCH = 1_000  # parked runs read back per query

T = TypeVar("T")
R = TypeVar("R")
AttemptKey = tuple[str, int]  # (run_id, lease_token)


def new_lease_token() -> int:
    """A lease token nobody can guess: uniformly random in 1..2**63-1, a positive int64.

    It is the attempt's credential: whoever presents (run_id, lease_token) speaks for the
    attempt, so it must not be derivable from another attempt's token (a counter would be).
    Drawn from the operating system's CSPRNG a block at a time: a crowd of runs needs tens of
    thousands of tokens a second, and one system call each showed on the fire path."""
    for (value,) in _TOKEN_BLOCK:
        token = value & MAX_LEASE_TOKEN
        if token:
            return token
    _TOKEN_BLOCK.refill()
    return new_lease_token()


class _TokenBlock:
    """Random 64-bit values read from ``os.urandom`` 4,096 at a time, each handed out once."""

    def __init__(self) -> None:
        self._values: Iterator[tuple[int]] = iter(())

    def __iter__(self) -> Iterator[tuple[int]]:
        return self._values

    def refill(self) -> None:
        self._values = struct.iter_unpack("<Q", os.urandom(8 * 4096))


_TOKEN_BLOCK = _TokenBlock()


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
    heartbeats: dict[AttemptKey, tuple[WorkerSession, Heartbeat]] = field(default_factory=dict)
    results: list[tuple[WorkerSession, AttemptResult]] = field(default_factory=list)
    # (worker_id, run_id, lease_token) of reports for attempts this node did not send to that
    # worker's stream (sent before a reconnect, or by another node): checked in the database.
    unvouched: set[tuple[str, str, int]] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.dispatches or self.heartbeats or self.results)


@dataclass(frozen=True, slots=True)
class _Parked:
    """A released run left in the database because its ready queue was full."""

    shard_id: int
    available_at: datetime


class _AllBut:
    """A ``skip`` for :meth:`Store.pending_runs` that skips every run but the wanted ones."""

    def __init__(self, wanted: Iterable[str]) -> None:
        self._wanted = set(wanted)

    def __contains__(self, run_id: object) -> bool:
        return run_id not in self._wanted


async def write_isolating(
    records: list[T],
    write: Callable[[list[T]], Awaitable[R]],
    *,
    landed: Callable[[list[T], R], None],
    rejected: Callable[[T, Exception], None],
) -> None:
    """Write ``records`` in order, in as few calls of ``write`` (one transaction each) as they allow.

    A call that fails for any reason but :class:`StorageUnavailable` is split in halves until the
    record that makes it fail is found: that one goes to ``rejected``, every other lands (and goes
    to ``landed`` with what ``write`` returned for it). :class:`StorageUnavailable` propagates;
    ``records`` is then left holding exactly what is not written yet, for the caller to retry.
    """
    chunks = [list(records)]  # the next chunk last; chunks are taken from the left of records
    while chunks:
        chunk = chunks.pop()
        try:
            outcome = await write(chunk)
        except StorageUnavailable:
            raise
        except Exception as error:
            if len(chunk) == 1:
                del records[:1]
                rejected(chunk[0], error)
            else:
                log.warning("journal write of %d records failed (%s): splitting it to find the bad one",
                            len(chunk), error)
                middle = len(chunk) // 2
                chunks += [chunk[middle:], chunk[:middle]]
            continue
        del records[:len(chunk)]
        landed(chunk, outcome)


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
        max_ready_per_type: int = DEFAULT_MAX_READY_PER_TYPE,
        max_ready_bytes_per_type: int = DEFAULT_MAX_READY_BYTES_PER_TYPE,
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._clock = clock
        self._metrics = metrics
        self._reschedule = reschedule
        self._max_ready = max(max_ready_per_type, 1)
        self._max_ready_bytes = max(max_ready_bytes_per_type, 1)
        self._ready_bytes: Counter[str] = Counter()  # payload bytes in each ready queue
        self._sessions: dict[str, list[WorkerSession]] = {}  # by job type, rotated for fairness
        self._ready: dict[str, deque[_Waiting]] = {}
        self._queued: set[str] = set()  # run ids in the ready queues
        # Runs beyond a full ready queue, by job type, oldest first; and the same ids in one set.
        self._parked: dict[str, dict[str, _Parked]] = {}
        self._parked_ids: set[str] = set()
        self._reloading: set[str] = set()  # job types whose parked runs are being read back
        self._journal = _Journal()
        self._journal_ready = asyncio.Event()
        self._journal_idle = asyncio.Event()
        self._journal_idle.set()
        self._stopping = False
        self._stop_requested = asyncio.Event()
        self._journal_deadline: float | None = None  # loop time after which a stopping journal gives up
        self._assigning = True
        self._claimed: set[str] = set()  # runs assigned whose dispatch is not yet durable
        self._in_flight: dict[AttemptKey, WorkerSession] = {}  # attempts sent, not yet reported
        self._background: set[asyncio.Task[None]] = set()
        metrics.ready_queue.set_function(lambda: self.ready_depth)  # read when scraped
        metrics.parked.set_function(lambda: self.parked_count)

    # -- sessions -------------------------------------------------------------------------------

    @property
    def workers_connected(self) -> int:
        return len({id(s) for sessions in self._sessions.values() for s in sessions})

    @property
    def ready_depth(self) -> int:
        # Also read by the metrics thread: list() takes the queues in one step under the GIL,
        # so a queue added meanwhile cannot break the iteration.
        return sum(map(len, list(self._ready.values())))

    @property
    def parked_count(self) -> int:
        """Released runs waiting in the database (not in memory) because their queue was full."""
        return len(self._parked_ids)

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
        self._hand_out(runs, confirm_first=confirm_first, reloaded=False)

    def holds(self, run_id: str) -> bool:
        """Whether this run is queued here, parked or being dispatched (so must not be released
        again: a parked run is read back from the database by this dispatcher itself)."""
        return run_id in self._queued or run_id in self._claimed or run_id in self._parked_ids

    def stop_assigning(self) -> None:
        """Shutting down: keep everything that is not yet sent for the successor."""
        self._assigning = False

    def cancel(self, runs: Iterable[Run]) -> None:
        """Stop these runs: drop them from the ready queues, tell the workers holding them."""
        by_session: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        cancelled = {run.run_id for run in runs}
        self._drop_queued(lambda queued: queued.run_id in cancelled)
        self._unpark(lambda run_id, _: run_id in cancelled)
        # By (run, token) rather than the run's stored token: an attempt sent a moment ago may
        # not be recorded yet.
        for (run_id, token), session in self._in_flight.items():
            if run_id in cancelled and session.connected:
                by_session.setdefault(id(session), (session, []))[1].append(AttemptRef(run_id, token))
        for session, refs in by_session.values():
            session.outbox.put_nowait(Cancel(refs, "the run was cancelled"))

    def forget_job(self, job_id: str) -> None:
        """The job was deleted: its queued runs were cancelled in the database."""
        # Parked runs of the job are not known by job; reading them back skips them (cancelled).
        self._drop_queued(lambda queued: queued.job_id == job_id)

    def drop_shards(self, shard_ids: Iterable[int]) -> None:
        """Forget queued runs of shards this node lost; their new owner delivers them."""
        lost = set(shard_ids)
        self._drop_queued(lambda queued: queued.shard_id in lost)
        self._unpark(lambda _, parked: parked.shard_id in lost)

    def forget_attempts(self, runs: Iterable[Run]) -> None:
        """These runs' earlier attempts expired: no result for them will be waited for."""
        expired = {run.run_id for run in runs}
        self._in_flight = {key: held for key, held in self._in_flight.items() if key[0] not in expired}

    def _hand_out(self, runs: Iterable[Run], *, confirm_first: bool, reloaded: bool) -> None:
        now = self._clock.now()
        batches: dict[int, tuple[WorkerSession, list[Assigned]]] = {}
        for run in runs:
            if run.run_id in self._claimed or run.run_id in self._parked_ids:
                continue  # a parked run comes back through _reload_parked, confirmed
            session = self._pick(run) if self._assigning else None
            if session is None:
                self._wait(run, confirm_first, reloaded=reloaded)
                continue
            batches.setdefault(id(session), (session, []))[1].append(self._assign(session, run, now, confirm_first))
        for session, assigned in batches.values():
            self._send(session, assigned)

    def _wait(self, run: Run, confirm_first: bool, *, reloaded: bool) -> None:
        """Queue a run no worker can take now; park it when its queue is full.

        A run released while older ones of its type are parked is parked behind them (unless it
        is one of them coming back), so that a steady inflow cannot starve the parked runs."""
        if run.run_id in self._queued:
            return
        queue = self._ready.setdefault(run.job_type, deque())
        parked = self._parked.get(run.job_type)
        if self._has_room(run.job_type, len(run.payload)) and (reloaded or not parked):
            self._queued.add(run.run_id)
            queue.append(_Waiting(run, confirm_first))
            self._ready_bytes[run.job_type] += len(run.payload)
            return
        if not parked:
            log.warning("ready queue of job type %r is full (%d runs): further runs wait in the database "
                        "until workers take these", run.job_type, len(queue))
            parked = self._parked[run.job_type] = {}
        parked[run.run_id] = _Parked(run.shard_id, run.available_at)
        self._parked_ids.add(run.run_id)

    def _has_room(self, job_type: str, payload_bytes: int) -> bool:
        """Whether the ready queue of ``job_type`` can take one more run of that size (an empty
        queue takes any run, so one larger than the byte bound still goes out)."""
        queued = len(self._ready.get(job_type, ()))
        return queued == 0 or (
            queued < self._max_ready and self._ready_bytes[job_type] + payload_bytes <= self._max_ready_bytes
        )

    def _drop_queued(self, matches: Callable[[Run], bool]) -> None:
        for job_type, queue in list(self._ready.items()):
            self._ready[job_type] = kept = deque(waiting for waiting in queue if not matches(waiting.run))
            self._ready_bytes[job_type] = sum(len(waiting.run.payload) for waiting in kept)
        self._queued = {waiting.run.run_id for queue in self._ready.values() for waiting in queue}

    def _unpark(self, matches: Callable[[str, _Parked], bool]) -> None:
        for job_type, parked in list(self._parked.items()):
            for run_id in [run_id for run_id, entry in parked.items() if matches(run_id, entry)]:
                del parked[run_id]
                self._parked_ids.discard(run_id)
            if not parked:
                del self._parked[job_type]

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
        token = new_lease_token()
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
                self._ready_bytes[job_type] -= len(waiting.run.payload)
                if waiting.run.run_id in self._claimed:
                    continue
                if session.tenant is not None and waiting.run.tenant != session.tenant:
                    self._queued.add(waiting.run.run_id)
                    self._ready_bytes[job_type] += len(waiting.run.payload)
                    skipped.append(waiting)
                    continue
                assigned.append(self._assign(session, waiting.run, now, waiting.confirm_first))
            if queue is not None:
                queue.extendleft(reversed(skipped))
            self._refill(job_type)
        if assigned:
            self._send(session, assigned)

    # -- parked runs ----------------------------------------------------------------------------

    def _refill(self, job_type: str) -> None:
        """Read parked runs of this type back once its queue is down to half (one task per type)."""
        if (job_type in self._reloading or not self._parked.get(job_type)
                or len(self._ready.get(job_type, ())) > self._max_ready // 2
                or self._ready_bytes[job_type] > self._max_ready_bytes // 2):
            return
        self._reloading.add(job_type)
        task = asyncio.create_task(self._reload_parked(job_type), name=f"dispatch-reload:{job_type}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reload_parked(self, job_type: str) -> None:
        """Fill the queue of ``job_type`` from its parked runs, oldest first, while it has room.

        The runs are released as read from the database (``confirm_first``): one that another
        attempt took meanwhile is not sent twice, and one no longer ``scheduled`` (cancelled) is
        not read at all."""
        try:
            while (self._assigning and self._ready_bytes[job_type] < self._max_ready_bytes
                   and (room := self._max_ready - len(self._ready.get(job_type, ()))) > 0):
                parked = self._parked.get(job_type)
                if not parked:
                    return
                wanted = dict(itertools.islice(parked.items(), min(room, RELOAD_BATCH)))
                try:
                    runs = await self._store.pending_runs(
                        {entry.shard_id for entry in wanted.values()},
                        max(entry.available_at for entry in wanted.values()) + timedelta(microseconds=1),
                        skip=_AllBut(wanted),
                    )
                except StorageError as error:
                    # Still parked: the next credit granted for this type tries again.
                    log.warning("could not read back %d parked runs of job type %r: %s", len(wanted), job_type, error)
                    return
                # Dropped meanwhile (a lost shard, a cancel) are not released; runs not found are
                # no longer scheduled, or changed: the lane's full scan finds those still pending.
                still_parked = [run for run in runs if run.run_id in self._parked_ids]
                self._unpark(lambda run_id, _, wanted=wanted: run_id in wanted)
                self._hand_out(still_parked, confirm_first=True, reloaded=True)
                if any(run.run_id in self._parked_ids for run in still_parked):
                    return  # the queue is full by bytes: parked again, read back when it drains
        finally:
            self._reloading.discard(job_type)

    # -- sending --------------------------------------------------------------------------------

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
        started: set[str] = set()

        def landed(_: list[Dispatch], attempts: list[Attempt]) -> None:
            started.update(attempt.run_id for attempt in attempts)

        try:
            await write_isolating([self._dispatch_record(session, item) for item in assigned],
                                  self._store.record_dispatches, landed=landed, rejected=self._dispatch_set_aside)
        except StorageError as error:
            # Still scheduled in the database: the next rebuild or sweep brings them back.
            log.warning("could not record %d dispatches before sending; not sent: %s", len(assigned), error)
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
        refused: list[AttemptKey] = []
        for beat in beats:
            key = (beat.run_id, beat.lease_token)
            if self._vouch(session, key, refused):
                self._journal.heartbeats[key] = (session, beat)
        self._log_refused(session, "heartbeats", refused)
        self._wake_journal()

    def results(self, session: WorkerSession, results: Iterable[AttemptResult]) -> None:
        refused: list[AttemptKey] = []
        for result in results:
            key = (result.run_id, result.lease_token)
            if self._vouch(session, key, refused):
                self._in_flight.pop(key, None)
                self._journal.results.append((session, result))
        self._log_refused(session, "results", refused)
        self._wake_journal()

    def _vouch(self, session: WorkerSession, key: AttemptKey, refused: list[AttemptKey]) -> bool:
        """Whether a report for this attempt may go to the journal: refused at once when this
        node sent the attempt to another worker; when it did not send it at all (it went out
        before a reconnect, or from another node), marked for a check against the database."""
        holder = self._in_flight.get(key)
        if holder is None:
            self._journal.unvouched.add((session.worker_id, *key))
        elif holder.worker_id != session.worker_id:
            refused.append(key)
            return False
        return True

    @staticmethod
    def _log_refused(session: WorkerSession, kind: str, refused: list[AttemptKey]) -> None:
        if refused:
            run_id, token = refused[0]
            log.warning("refused %d %s from worker %s for attempts sent to another worker (first: run %s, token %d)",
                        len(refused), kind, session.worker_id, run_id, token)

    def _wake_journal(self) -> None:
        self._journal_idle.clear()
        self._journal_ready.set()

    # -- the journal writer ---------------------------------------------------------------------

    async def run(self) -> None:
        """Flush the journal until stopped and drained; every batch is one round of durable writes.

        An unreachable database is retried with backoff; once stopping, only for
        ``JOURNAL_STOP_GRACE``, then what is left is given up (and said so)."""
        retry = JOURNAL_RETRY.total_seconds()
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
                retry = JOURNAL_RETRY.total_seconds()
            except StorageUnavailable as error:
                self._requeue(batch)
                if self._stop_grace_over():
                    self._give_up_journal(error)
                    return
                log.warning("journal write failed, retrying in %.1f s: %s", retry, error)
                await self._retry_pause(retry)
                retry = min(retry * 2, JOURNAL_RETRY_CAP.total_seconds())
            if not self._journal:
                self._journal_idle.set()
            self._journal_ready.set()  # loop once more: returns if stopping and drained

    async def flush(self, timeout: float) -> None:
        """Wait until everything journalled so far is durable (or the timeout passes)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._journal_idle.wait()

    def stop(self) -> None:
        """Let :meth:`run` return once the journal is drained (or ``JOURNAL_STOP_GRACE`` passed)."""
        if not self._stopping:
            self._journal_deadline = asyncio.get_running_loop().time() + JOURNAL_STOP_GRACE.total_seconds()
        self._stopping = True
        self._stop_requested.set()
        self._journal_ready.set()

    def _stop_grace_over(self) -> bool:
        return self._journal_deadline is not None and asyncio.get_running_loop().time() >= self._journal_deadline

    async def _retry_pause(self, seconds: float) -> None:
        """Sleep before a retry: cut short by a stop (one more try at once), and once stopping
        never past the end of the grace."""
        if self._journal_deadline is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._stop_requested.wait()
            return
        left = self._journal_deadline - asyncio.get_running_loop().time()
        await asyncio.sleep(max(0.0, min(seconds, left)))

    def _give_up_journal(self, error: Exception) -> None:
        journal = self._journal
        log.error("stopping with %d dispatches, %d heartbeats and %d results not durable (%s): those runs "
                  "stay scheduled and are delivered again; the workers report those results to another node",
                  len(journal.dispatches), len(journal.heartbeats), len(journal.results), error)
        self._journal = _Journal()
        self._journal_idle.set()

    def _requeue(self, batch: _Journal) -> None:
        batch.dispatches.extend(self._journal.dispatches)
        batch.heartbeats.update(self._journal.heartbeats)
        batch.results.extend(self._journal.results)
        batch.unvouched |= self._journal.unvouched
        self._journal = batch

    async def _write(self, batch: _Journal) -> None:
        """Write one batch: dispatches first (a result is never written before its dispatch).

        What lands is removed from ``batch`` as it lands, so that after a failure the batch holds
        exactly what is left to write."""
        if batch.dispatches:
            await write_isolating(batch.dispatches, self._store.record_dispatches,
                                  landed=self._dispatches_landed, rejected=self._dispatch_rejected)
        if batch.unvouched:
            await self._refuse_foreign(batch)
        if batch.heartbeats:
            beats = list(batch.heartbeats.values())
            try:
                await write_isolating(beats, self._record_heartbeats, landed=self._cancel_stale,
                                      rejected=self._heartbeat_rejected)
            finally:
                batch.heartbeats = {(beat.run_id, beat.lease_token): (session, beat) for session, beat in beats}
        if batch.results:
            await write_isolating(batch.results, self._record_results, landed=self._settle,
                                  rejected=self._result_rejected)

    async def _record_heartbeats(self, beats: list[tuple[WorkerSession, Heartbeat]]) -> set[str]:
        return set(await self._store.record_heartbeats([beat for _, beat in beats]))

    async def _record_results(self, results: list[tuple[WorkerSession, AttemptResult]]) -> list[ResultOutcome]:
        return await self._store.record_results([result for _, result in results])

    def _dispatches_landed(self, dispatches: list[Dispatch], attempts: list[Attempt]) -> None:
        recorded = {attempt.run_id for attempt in attempts}
        for dispatch in dispatches:
            self._claimed.discard(dispatch.run_id)
        self._withdraw([d for d in dispatches if d.run_id not in recorded])

    # -- records set aside ------------------------------------------------------------------------

    def _set_aside(self, what: str, error: Exception) -> None:
        self._metrics.set_aside.labels(kind="journal_record").inc()
        log.error("journal record set aside, the others are written: %s failed with %s: %s",
                  what, type(error).__name__, error, exc_info=not isinstance(error, StorageError))

    def _dispatch_set_aside(self, dispatch: Dispatch, error: Exception) -> None:
        # Not recorded: the run stays scheduled, and the lane's full scan delivers it again.
        self._set_aside(f"dispatch of run {dispatch.run_id} to worker {dispatch.worker_id!r}", error)

    def _dispatch_rejected(self, dispatch: Dispatch, error: Exception) -> None:
        """A dispatch already sent (fast) that cannot be recorded: the worker is told to stop it."""
        self._dispatch_set_aside(dispatch, error)
        self._claimed.discard(dispatch.run_id)
        self._withdraw([dispatch])

    def _heartbeat_rejected(self, beat: tuple[WorkerSession, Heartbeat], error: Exception) -> None:
        # The lease is not extended; the worker's next heartbeat tries again.
        session, heartbeat = beat
        self._set_aside(f"heartbeat of run {heartbeat.run_id} from worker {session.worker_id!r}", error)

    def _result_rejected(self, reported: tuple[WorkerSession, AttemptResult], error: Exception) -> None:
        # Not acknowledged: the worker keeps the result and reports it again after a reconnect;
        # meanwhile the lease expires and the run is retried per its policy.
        session, result = reported
        self._set_aside(f"result of run {result.run_id} from worker {session.worker_id!r}", error)

    # -- the attempt's worker -------------------------------------------------------------------

    async def _refuse_foreign(self, batch: _Journal) -> None:
        """Drop from ``batch`` the reports of attempts that were sent to another worker, judged
        by the attempts table; attempts verified as the reporter's are adopted by its stream (so
        later heartbeats need no check, and a cancel reaches it). An attempt with no row passes:
        the store records such a result as superseded, as before."""
        owners = await self._attempt_workers({(run_id, token) for _, run_id, token in batch.unvouched})
        foreign = {(worker, run_id, token) for worker, run_id, token in batch.unvouched
                   if owners.get((run_id, token), worker) != worker}
        batch.unvouched = set()
        finished = {(result.run_id, result.lease_token) for _, result in batch.results}
        for key, (session, _) in batch.heartbeats.items():
            if (session.worker_id, *key) not in foreign and key not in finished and session.connected:
                self._in_flight.setdefault(key, session)
        if not foreign:
            return
        by_worker: dict[str, list[AttemptKey]] = {}
        for worker, run_id, token in foreign:
            by_worker.setdefault(worker, []).append((run_id, token))
        for worker, keys in by_worker.items():
            run_id, token = keys[0]
            log.warning("refused reports of worker %s for %d attempts sent to another worker (first: run %s, "
                        "token %d)", worker, len(keys), run_id, token)
        batch.heartbeats = {key: (session, beat) for key, (session, beat) in batch.heartbeats.items()
                            if (session.worker_id, *key) not in foreign}
        batch.results = [(session, result) for session, result in batch.results
                         if (session.worker_id, result.run_id, result.lease_token) not in foreign]

    async def _attempt_workers(self, keys: set[AttemptKey]) -> dict[AttemptKey, str]:
        """The worker each of these attempts was sent to, as the attempts table records it.

        A run whose attempts cannot be read (other than the database being unreachable) has its
        attempts reported as sent to nobody, so its reports are refused rather than trusted."""
        owners: dict[AttemptKey, str] = {}
        for run_id in {run_id for run_id, _ in keys}:
            try:
                attempts = await self._store.list_attempts(run_id)
            except StorageUnavailable:
                raise
            except Exception as error:
                log.warning("could not read the attempts of run %s to check who reports them: %s", run_id, error)
                owners.update({key: "" for key in keys if key[0] == run_id})
                continue
            owners.update({(run_id, attempt.lease_token): attempt.worker_id for attempt in attempts})
        return owners

    # -- acting on what was written -------------------------------------------------------------

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
