"""The journal of dispatches, heartbeats and results: what happened, made durable in batches.

One writer task (:meth:`Journal.run`) flushes what is pending, in order (a result is never
written before its dispatch), and acts on what was written: a dispatch the database refused is
withdrawn from its worker, a stale heartbeat's attempt is cancelled, a durable result is
acknowledged. A write that fails for any reason but the database being unreachable is split
until the record that makes it fail is found (:func:`write_isolating`); that one is set aside,
the rest land.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol, TypeVar

from fastlane.domain.errors import StorageError, StorageUnavailable
from fastlane.domain.models import Attempt, Run, RunState
from fastlane.engine.dispatch.messages import Acknowledge, AttemptKey, AttemptRef, Cancel, WorkerSession
from fastlane.runtime.metrics import Metrics
from fastlane.storage import AttemptResult, Dispatch, Heartbeat, Reporter, ReporterOf, ResultOutcome, Store
from fastlane.storage.driver_errors import gave_up_waiting

log = logging.getLogger("fastlane.dispatch")

JOURNAL_RETRY = timedelta(milliseconds=200)  # the first retry of an unavailable database
# Doubling up to this. Short: once the database is back, the results waiting here must land
# before their attempts' leases (3 s at least) run out, or the runs are delivered again. A try a
# second is nothing to a database that is back, and one connection attempt to one still away.
JOURNAL_RETRY_CAP = timedelta(seconds=1)
# Once stopping, the journal tries this long to make what it holds durable, then gives up (the
# node waits a little longer than this for it): a node must stop while its database is down.
JOURNAL_STOP_GRACE = timedelta(seconds=4)

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class JournalBatch:
    """What is journalled and not yet durable: written by one writer round, in this order."""

    dispatches: list[Dispatch] = field(default_factory=list)
    heartbeats: dict[AttemptKey, tuple[WorkerSession, Heartbeat]] = field(default_factory=dict)
    results: list[tuple[WorkerSession, AttemptResult]] = field(default_factory=list)
    # (worker_id, run_id, lease_token) of reports for attempts this node did not send to that
    # worker's stream (sent before a reconnect, or by another node): checked in the database.
    unvouched: set[tuple[str, str, int]] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.dispatches or self.heartbeats or self.results)


class WorkflowHooks(Protocol):
    """The node's workflow coordinator, as dispatch sees it (:mod:`fastlane.engine.workflows`)."""

    def take_starts(self, runs: Iterable[Run]) -> Iterable[Run]:
        """Start the workflow runs of the due runs of workflow jobs; return the other runs."""
        ...

    def ended(self, workflow_run_ids: set[str]) -> None:
        """Step runs of these workflow runs ended."""
        ...


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


class Journal:
    """Pending records and the one task that makes them durable.

    ``claimed`` (runs assigned whose dispatch is not yet durable) and ``in_flight`` (attempts
    sent, not yet reported, by the session they went to) are the dispatcher's own, shared: the
    journal updates them as writes land, in place."""

    def __init__(
        self,
        store: Store,
        *,
        node_id: str,
        metrics: Metrics,
        reschedule: Callable[[Run], None],
        claimed: set[str],
        in_flight: MutableMapping[AttemptKey, WorkerSession],
        workflows: WorkflowHooks | None = None,
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._metrics = metrics
        self._reschedule = reschedule
        self._workflows = workflows  # told the workflow runs whose step runs just ended
        self._claimed = claimed
        self._in_flight = in_flight
        self.pending = JournalBatch()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # Writer rounds begun, and the last that ended with its batch written: what was pending
        # when a round began is written once a round at least that late has landed.
        self._rounds_begun = 0
        self._rounds_landed = 0
        self._round_landed = asyncio.Event()  # set, and replaced, each time a round lands
        self._stopping = False
        self._stop_requested = asyncio.Event()
        self._deadline: float | None = None  # loop time after which a stopping journal gives up

    def wake(self) -> None:
        """Something was added to :attr:`pending`: write it."""
        self._idle.clear()
        self._ready.set()

    # -- the writer -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Flush the journal until stopped and drained; every batch is one round of durable writes.

        An unreachable database is retried with backoff; once stopping, only for
        ``JOURNAL_STOP_GRACE``, then what is left is given up (and said so)."""
        retry = JOURNAL_RETRY.total_seconds()
        while True:
            await self._ready.wait()
            self._ready.clear()
            if not self.pending:
                self._idle.set()
                if self._stopping:
                    return
                continue
            batch, self.pending = self.pending, JournalBatch()
            self._rounds_begun += 1
            try:
                await self._write(batch)
                self._landed(self._rounds_begun)
                retry = JOURNAL_RETRY.total_seconds()
            except StorageUnavailable as error:
                self._requeue(batch)
                if self._stop_grace_over():
                    self._give_up(error)
                    return
                if gave_up_waiting(error.__cause__):
                    retry = JOURNAL_RETRY.total_seconds()  # the database is there: a lock was busy
                log.warning("journal write failed, retrying in %.1f s: %s", retry, error)
                await self._retry_pause(retry)
                retry = min(retry * 2, JOURNAL_RETRY_CAP.total_seconds())
            if not self.pending:
                self._idle.set()
            self._ready.set()  # loop once more: returns if stopping and drained

    async def flush(self, timeout: float) -> None:
        """Wait until the journal is empty (or the timeout passes)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()

    async def written(self, timeout: float) -> None:
        """Wait until every record journalled before this call is written (or set aside, or
        given up), or the timeout passes. Records journalled later need not be: under steady
        load the journal is never empty, yet this returns within a round or two."""
        target = self._rounds_begun + (1 if self.pending else 0)  # a failed round's batch is pending again
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._rounds_landed < target:
                    await self._round_landed.wait()

    def _landed(self, round_number: int) -> None:
        self._rounds_landed = round_number
        self._round_landed.set()
        self._round_landed = asyncio.Event()

    def stop(self) -> None:
        """Let :meth:`run` return once the journal is drained (or ``JOURNAL_STOP_GRACE`` passed)."""
        if not self._stopping:
            self._deadline = asyncio.get_running_loop().time() + JOURNAL_STOP_GRACE.total_seconds()
        self._stopping = True
        self._stop_requested.set()
        self._ready.set()

    def _stop_grace_over(self) -> bool:
        return self._deadline is not None and asyncio.get_running_loop().time() >= self._deadline

    async def _retry_pause(self, seconds: float) -> None:
        """Sleep before a retry: cut short by a stop (one more try at once), and once stopping
        never past the end of the grace."""
        if self._deadline is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._stop_requested.wait()
            return
        left = self._deadline - asyncio.get_running_loop().time()
        await asyncio.sleep(max(0.0, min(seconds, left)))

    def _give_up(self, error: Exception) -> None:
        journal = self.pending
        log.error("stopping with %d dispatches, %d heartbeats and %d results not durable (%s): those runs "
                  "stay scheduled and are delivered again; the workers report those results to another node",
                  len(journal.dispatches), len(journal.heartbeats), len(journal.results), error)
        self.pending = JournalBatch()
        self._idle.set()
        self._landed(self._rounds_begun)  # nothing more will land: no one waits for it

    def _requeue(self, batch: JournalBatch) -> None:
        batch.dispatches.extend(self.pending.dispatches)
        batch.heartbeats.update(self.pending.heartbeats)
        batch.results.extend(self.pending.results)
        batch.unvouched |= self.pending.unvouched
        self.pending = batch

    async def _write(self, batch: JournalBatch) -> None:
        """Write one batch: dispatches first (a result is never written before its dispatch).

        What lands is removed from ``batch`` as it lands, so that after a failure the batch holds
        exactly what is left to write. A batch of more than one kind goes in one transaction
        (:meth:`_write_together`); should that fail for a reason of its data, each kind is then
        written apart, split until the record that fails is found."""
        kinds = sum(1 for part in (batch.dispatches, batch.heartbeats, batch.results) if part)
        if kinds > 1 and not batch.unvouched:
            try:
                await self._write_together(batch)
                return
            except StorageUnavailable:
                raise
            except Exception as error:
                log.warning("journal round of %d dispatches, %d heartbeats and %d results failed (%s): "
                            "writing them apart to find the record that fails", len(batch.dispatches),
                            len(batch.heartbeats), len(batch.results), error)
        if batch.dispatches:
            await write_isolating(batch.dispatches, self._store.attempts.record_dispatches,
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

    async def _write_together(self, batch: JournalBatch) -> None:
        beats = list(batch.heartbeats.values())
        written = await self._store.attempts.record_round(
            batch.dispatches, [beat for _, beat in beats], [result for _, result in batch.results],
            reporter_of=self._reporters(batch.results))
        dispatches, results = batch.dispatches, batch.results
        batch.dispatches, batch.heartbeats, batch.results = [], {}, []
        if dispatches:
            self._dispatches_landed(dispatches, written.attempts)
        if beats:
            self._cancel_stale(beats, set(written.stale))
        if results:
            self._settle(results, written.outcomes)

    async def _record_heartbeats(self, beats: list[tuple[WorkerSession, Heartbeat]]) -> set[str]:
        return set(await self._store.attempts.record_heartbeats([beat for _, beat in beats]))

    async def _record_results(self, results: list[tuple[WorkerSession, AttemptResult]]) -> list[ResultOutcome]:
        return await self._store.attempts.record_results([result for _, result in results],
                                                reporter_of=self._reporters(results))

    def _reporters(self, results: list[tuple[WorkerSession, AttemptResult]]) -> ReporterOf:
        """Who reported each of these results, for the store to record a result whose dispatch
        it never saw as that worker's attempt. Asked of rarely (only for such results), so the
        index is built on the first question."""
        index: dict[AttemptKey, WorkerSession] | None = None

        def reporter_of(run_id: str, lease_token: int) -> Reporter | None:
            nonlocal index
            if index is None:
                index = {(result.run_id, result.lease_token): session for session, result in results}
            session = index.get((run_id, lease_token))
            return None if session is None else Reporter(session.worker_id, self._node_id, session.tenant)

        return reporter_of

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

    def dispatch_set_aside(self, dispatch: Dispatch, error: Exception) -> None:
        # Not recorded: the run stays scheduled, and the lane's full scan delivers it again.
        self._set_aside(f"dispatch of run {dispatch.run_id} to worker {dispatch.worker_id!r}", error)

    def _dispatch_rejected(self, dispatch: Dispatch, error: Exception) -> None:
        """A dispatch already sent (fast) that cannot be recorded: the worker is told to stop it."""
        self.dispatch_set_aside(dispatch, error)
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

    async def _refuse_foreign(self, batch: JournalBatch) -> None:
        """Drop from ``batch`` the reports of attempts that were sent to another worker, judged
        by the attempts table; attempts verified as the reporter's are adopted by its stream (so
        later heartbeats need no check, and a cancel reaches it). An attempt with no row passes:
        the store records such a result as superseded, as before."""
        owners = await self._attempt_workers({(run_id, lease_token) for _, run_id, lease_token in batch.unvouched})
        foreign = {(worker, run_id, lease_token) for worker, run_id, lease_token in batch.unvouched
                   if owners.get((run_id, lease_token), worker) != worker}
        batch.unvouched = set()
        finished = {(result.run_id, result.lease_token) for _, result in batch.results}
        for key, (session, _) in batch.heartbeats.items():
            if (session.worker_id, *key) not in foreign and key not in finished and session.connected:
                self._in_flight.setdefault(key, session)
        if not foreign:
            return
        by_worker: dict[str, list[AttemptKey]] = {}
        for worker, run_id, lease_token in foreign:
            by_worker.setdefault(worker, []).append((run_id, lease_token))
        for worker, keys in by_worker.items():
            run_id, lease_token = keys[0]
            log.warning("refused reports of worker %s for %d attempts sent to another worker (first: run %s, "
                        "token %d)", worker, len(keys), run_id, lease_token)
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
                attempts = await self._store.runs.list_attempts(run_id)
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
        # One metric update per outcome kind, job type and tenant, and batch.
        counted: Counter[tuple[str, str, str]] = Counter()
        labels_of = self._metrics.queue_labels.of
        workflows: set[str] = set()
        for outcome in outcomes:
            job_type, tenant = labels_of(outcome.queue)
            if not outcome.accepted:
                counted["superseded", job_type, tenant] += 1
                continue
            state = outcome.state
            if outcome.released:
                counted["released_from_buffer", job_type, tenant] += 1
            elif state is RunState.SCHEDULED:
                counted["retry", job_type, tenant] += 1
            else:
                counted[state.value, job_type, tenant] += 1
            if state is RunState.SCHEDULED:
                self._reschedule(outcome.run)
            elif state.is_final and (workflow_run_id := outcome.workflow_run_id) is not None:
                workflows.add(workflow_run_id)
        if workflows and self._workflows is not None:
            self._workflows.ended(workflows)
        for (kind, job_type, tenant), count in counted.items():
            self._metrics.runs.labels(outcome=kind, job_type=job_type, tenant=tenant).inc(count)
