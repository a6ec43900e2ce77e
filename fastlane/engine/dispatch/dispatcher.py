"""The dispatcher: ready queues by job type, worker sessions and their credits, sending.

See :mod:`fastlane.engine.dispatch` for how a run is sent (fast or confirmed) and the guards,
:mod:`.send_ahead` for runs sent ahead of their instant, :mod:`.ready_queue` for the order of waiting runs,
:mod:`.key_gate` for concurrency keys.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from fastlane.domain.models import Delivery, Run
from fastlane.domain.records import KeyCap
from fastlane.engine.dispatch.confirmed_sender import ConfirmedSender
from fastlane.engine.dispatch.gauges import DispatchGauges
from fastlane.engine.dispatch.in_flight import InFlight
from fastlane.engine.dispatch.journal import Journal, WorkflowHooks
from fastlane.engine.dispatch.key_gate import KeyGate
from fastlane.engine.dispatch.lease_tokens import new_lease_token
from fastlane.engine.dispatch.messages import Assign, Assigned, AttemptKey, AttemptRef, Cancel, WorkerSession
from fastlane.engine.dispatch.parked_runs import ParkedRuns
from fastlane.engine.dispatch.ready_queue import ReadyQueue
from fastlane.engine.dispatch.reserve import PriorityReserve, Reserve
from fastlane.engine.dispatch.send_ahead import ClockProbe, SendAhead
from fastlane.runtime.clock import Clock
from fastlane.runtime.metrics import Metrics
from fastlane.storage import AttemptResult, Dispatch, Heartbeat, Store

log = logging.getLogger("fastlane.dispatch")

# A whole crowd of small runs (the write-ahead holds up to 150,000) is sent from memory; large
# payloads are bounded by bytes instead (a 1 MiB payload every 0.1 s fills 64 MiB in 6 s).
DEFAULT_MAX_READY_PER_TYPE = 150_000
DEFAULT_MAX_READY_BYTES_PER_TYPE = 64 << 20


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A run in a ready queue, and how it must be sent."""

    run: Run
    confirm_first: bool


class Dispatcher:
    """Matches released runs with worker credits and journals every attempt."""

    def __init__(
        self, store: Store, *, node_id: str, clock: Clock, metrics: Metrics, reschedule: Callable[[Run], None],
        max_ready_per_type: int = DEFAULT_MAX_READY_PER_TYPE,
        max_ready_bytes_per_type: int = DEFAULT_MAX_READY_BYTES_PER_TYPE,
        send_ahead: timedelta = timedelta(0),
        tenant_weights: Mapping[str, int] | None = None,
        tenant_max_in_flight: Mapping[str, int] | None = None,
        priority_reserve: PriorityReserve | None = None,
        workflows: WorkflowHooks | None = None,  # takes due runs of workflow jobs, hears of step runs ended
    ) -> None:
        self._store = store
        self._workflows = workflows
        self._tenant_weights = dict(tenant_weights or {})  # runs per turn of a ready queue (1 if not named)
        self._tenant_caps = dict(tenant_max_in_flight or {})  # attempts in flight per tenant (no cap if not named)
        self._node_id = node_id
        self._clock = clock
        self._metrics = metrics
        self._max_ready = max(max_ready_per_type, 1)
        self._max_ready_bytes = max(max_ready_bytes_per_type, 1)
        self._ready_bytes: Counter[str] = Counter()  # payload bytes in each ready queue
        self._sessions: dict[str, list[WorkerSession]] = {}  # by job type, rotated for fairness
        self._ready: dict[str, ReadyQueue[_Waiting]] = {}  # fair across tenants: see ready_queue.py
        self._queued: set[str] = set()  # run ids in the ready queues
        self._helpers = helpers = _Helpers(self)
        self._parked = ParkedRuns(store, ready=helpers)
        self._assigning = True
        # Shared with the journal, which updates both as writes land: changed in place only.
        self._claimed: set[str] = set()  # runs assigned whose dispatch is not yet durable
        self._in_flight = InFlight()  # attempts sent, not yet reported
        self._reserve = Reserve(priority_reserve, self._in_flight)  # credits kept for urgent runs
        self._journal = Journal(store, node_id=node_id, metrics=metrics, reschedule=reschedule,
                                claimed=self._claimed, in_flight=self._in_flight, workflows=workflows)
        self._background: set[asyncio.Task[None]] = set()
        self._ahead = SendAhead(send_ahead, clock=clock, metrics=metrics)
        self._gate = KeyGate(helpers)
        self._confirmed = ConfirmedSender(store, claimed=self._claimed, in_flight=self._in_flight, gate=self._gate,
                                          dispatcher=helpers)
        self._gauges = DispatchGauges(metrics, clock=clock, ready=self._ready, sessions=self._sessions, gate=self._gate,
                                      parked=self._parked, in_flight=self._in_flight, tenant_full=self._tenant_full,
                                      serves=self._serves)

    # -- sessions -------------------------------------------------------------------------------

    @property
    def workers_connected(self) -> int:
        return len({id(s) for sessions in self._sessions.values() for s in sessions})

    def worker_sessions(self) -> list[tuple[WorkerSession, int]]:
        """Each connected worker stream with its attempts in flight from this node."""
        sessions = {id(s): s for kinds in self._sessions.values() for s in kinds}
        holding = self._in_flight.per_session()
        return [(session, holding.get(session, 0)) for session in sessions.values()]

    def backlogs(self) -> dict[tuple[str, str], int]:
        """Released runs waiting for a free credit or for their tenant's cap, by (job type, tenant),
        where a connected worker serves them: how far each queue is behind the capacity it gets (the
        write-ahead writes no new runs for a queue far behind; a tenant at its cap is behind too)."""
        return {(kind, tenant): n for kind, queue in list(self._ready.items()) for tenant, n in queue.tenant_depths().items()
                if self._serves(kind, tenant)}

    def assigned_totals(self) -> dict[tuple[str, str], int]:
        """Attempts assigned since the node started, by (job type, tenant): each queue's pace."""
        return self._in_flight.assigned_totals()

    def _serves(self, kind: str, tenant: str) -> bool:
        return any(session.tenant in (None, tenant) for session in list(self._sessions.get(kind, ())))

    def _tenant_full(self, tenant: str) -> bool:
        cap = self._tenant_caps.get(tenant)
        return cap is not None and self._in_flight.tenant_count(tenant) >= cap

    @property
    def ready_depth(self) -> int:
        """Released runs queued in the ready queues (also read by the metrics thread)."""
        return self._gauges.ready_depth

    @property
    def parked_count(self) -> int:
        """Released runs waiting in the database (not in memory) because their queue was full."""
        return len(self._parked)

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
        self._ahead.disconnected(session)
        for key in [key for key, holder in self._in_flight.items() if holder is session]:
            del self._in_flight[key]
        for job_type in session.job_types:
            sessions = self._sessions.get(job_type, [])
            if session in sessions:
                sessions.remove(session)
            if not sessions:
                self._sessions.pop(job_type, None)
        self._metrics.workers.set(self.workers_connected)
        log.info("worker %s disconnected", session.worker_id)

    def grant(self, session: WorkerSession, credits: int) -> None:
        if session.draining:
            return  # granted before the worker's Drain reached the stream's reader: no more runs
        session.credits += max(credits, 0)
        self._assign_ready(session)

    def drain(self, session: WorkerSession) -> None:
        """The worker is stopping: send it nothing more, whatever it granted before. What it was
        sent it still runs and reports; what would have gone to it waits for another worker."""
        if not session.draining:
            log.info("worker %s is stopping: %d credits taken back, no more runs for it", session.worker_id,
                     session.credits)
        session.draining, session.credits = True, 0

    # -- runs -----------------------------------------------------------------------------------

    def release(self, runs: Iterable[Run], *, confirm_first: bool = False) -> None:
        """Hand due runs to workers with credits; queue the rest.

        ``confirm_first``: the runs came from the database, not from this node's own writes,
        so each is sent only once its dispatch has durably taken it from ``scheduled``.
        """
        runs = self._workflows.take_starts(runs) if self._workflows is not None else runs
        self._assign_or_queue(runs, confirm_first=confirm_first, reloaded=False)

    def holds(self, run_id: str) -> bool:
        """Whether this run is queued here, parked or being dispatched (so must not be released
        again: a parked run is read back from the database by this dispatcher itself)."""
        return (run_id in self._queued or run_id in self._claimed or run_id in self._parked
                or run_id in self._gate)

    def stop_assigning(self) -> None:
        """Shutting down: keep everything that is not yet sent for the successor."""
        self._assigning = False
        self._gate.stop()

    def cancel(self, runs: Iterable[Run]) -> None:
        """Stop these runs: drop them from the ready queues, tell the workers holding them."""
        by_session: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        cancelled = {run.run_id for run in runs}
        self._drop_queued(lambda queued: queued.run_id in cancelled)
        self._parked.unpark(lambda run_id, _: run_id in cancelled)
        self._gate.remove_if(lambda blocked: blocked.run_id in cancelled)
        # By (run, lease token) rather than the run's stored lease token: an attempt sent a moment ago may
        # not be recorded yet.
        for (run_id, lease_token), session in self._in_flight.items():
            if run_id in cancelled and session.connected:
                by_session.setdefault(id(session), (session, []))[1].append(AttemptRef(run_id, lease_token))
        for session, refs in by_session.values():
            session.outbox.put_nowait(Cancel(refs, "the run was cancelled"))

    def forget_job(self, job_id: str) -> None:
        """The job was deleted: its queued runs were cancelled in the database; its attempts sent
        ahead and not yet started are withdrawn (started ones run on, as any sent before)."""
        # Parked runs of the job are not known by job; reading them back skips them (cancelled).
        self._drop_queued(lambda queued: queued.job_id == job_id)
        self._gate.remove_if(lambda blocked: blocked.job_id == job_id)
        for session, refs in self._ahead.withdrawals(job_id, self._clock.now(), self._in_flight):
            session.outbox.put_nowait(Cancel(refs, "the job was deleted before the run's instant", unstarted_only=True))

    def drop_shards(self, shard_ids: Iterable[int]) -> None:
        """Forget queued runs of shards this node lost; their new owner delivers them."""
        lost = set(shard_ids)
        self._drop_queued(lambda queued: queued.shard_id in lost)
        self._parked.unpark(lambda _, parked: parked.shard_id in lost)
        self._gate.remove_if(lambda blocked: blocked.shard_id in lost)

    def forget_attempts(self, runs: Iterable[Run]) -> None:
        """These runs' earlier attempts expired: no result for them will be waited for."""
        expired = {run.run_id for run in runs}
        for key in [key for key in self._in_flight if key[0] in expired]:
            del self._in_flight[key]

    # -- sending ahead (see .send_ahead) --------------------------------------------------------------

    @property
    def ahead_lead(self) -> timedelta:
        """How long before their instant runs may be offered now: the lead while a worker can hold runs, else 0."""
        return self._ahead.usable_lead

    def watch_ahead(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when a first connected worker becomes able to hold runs sent ahead."""
        self._ahead.watch(wake)

    def clock_probed(self, session: WorkerSession, probe: ClockProbe) -> None:
        """Echo a worker's clock probe at once with this node's time, and take its estimate."""
        self._ahead.probed(session, probe)

    def offer_ahead(self, runs: Iterable[Run]) -> list[Run]:
        """Send runs due within the lead, with ``start_at`` = their instant, to sessions with a free
        credit whose clock is known within the lead; return the runs not sent (the lane releases
        them on their instant). Never a run confirmed first (at-most-once, keyed) nor one of a
        tenant at its cap: those go on their instant."""
        now = self._clock.now()
        left: list[Run] = []
        batches: dict[int, tuple[WorkerSession, list[Assigned]]] = {}
        for run in runs:
            if run.run_id in self._claimed or run.run_id in self._parked:
                continue  # as in _assign_or_queue: never sent twice
            sendable = (self._assigning and run.delivery is not Delivery.AT_MOST_ONCE and run.concurrency_key is None
                        and not self._tenant_full(run.tenant))
            if (session := self._pick(run, ahead=True) if sendable else None) is None:
                left.append(run)
                continue
            item = self._assign(session, run, now, False, start_at=run.available_at)
            self._ahead.sent((run.run_id, item.lease_token), run.job_id, run.available_at, now)
            batches.setdefault(id(session), (session, []))[1].append(item)
        for session, assigned in batches.values():
            self._send(session, assigned)
            self._metrics.sent_ahead.inc(len(assigned))
        return left

    def _assign_or_queue(self, runs: Iterable[Run], *, confirm_first: bool, reloaded: bool, offered: bool = False) -> None:
        """``offered``: the runs come from the key gate, so may go ahead of those it still holds."""
        now = self._clock.now()
        batches: dict[int, tuple[WorkerSession, list[Assigned]]] = {}
        for run in runs:
            if run.run_id in self._claimed or run.run_id in self._parked or run.run_id in self._gate:
                continue  # a parked run comes back read from the database (.parked_runs), a blocked one through the gate
            if not offered and self._gate.has_blocked(run):
                self._gate.block([run])  # behind the runs of its key blocked before it
                continue
            session = self._pick(run) if self._assigning and not self._tenant_full(run.tenant) else None
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
        queue = self._ready.get(run.job_type)
        if queue is None:
            queue = self._ready[run.job_type] = ReadyQueue(lambda tenant: self._tenant_weights.get(tenant, 1),
                                                           self._reserve.urgent_priority)
        if self._has_room(run.job_type, len(run.payload)) and (reloaded or not self._parked.any_of(run.job_type)):
            self._queued.add(run.run_id)
            queue.append(_Waiting(run, confirm_first))
            self._ready_bytes[run.job_type] += len(run.payload)
            return
        self._parked.park(run, len(queue))

    def _has_room(self, job_type: str, payload_bytes: int) -> bool:
        """Whether the ready queue of ``job_type`` can take one more run of that size (an empty
        queue takes any run, so one larger than the byte bound still goes out)."""
        queued = len(self._ready.get(job_type, ()))
        return queued == 0 or (
            queued < self._max_ready and self._ready_bytes[job_type] + payload_bytes <= self._max_ready_bytes
        )

    def _drop_queued(self, matches: Callable[[Run], bool]) -> None:
        for job_type, queue in self._ready.items():
            for waiting in queue.remove_if(lambda waiting: matches(waiting.run)):
                self._ready_bytes[job_type] -= len(waiting.run.payload)
                self._queued.discard(waiting.run.run_id)

    def _pick(self, run: Run, *, ahead: bool = False) -> WorkerSession | None:
        sessions = self._sessions.get(run.job_type)
        if not sessions:
            return None
        for _ in range(len(sessions)):
            session = sessions[0]
            if len(sessions) > 1:
                sessions.append(sessions.pop(0))
            if (session.credits > 0 and (session.tenant is None or session.tenant == run.tenant)
                    and (not ahead or self._ahead.can_hold(session))
                    and (not self._reserve.ordinary(run) or self._reserve.ordinary_room(session))):
                return session
        return None

    def _assign(self, session: WorkerSession, run: Run, now: datetime, confirm_first: bool,
                start_at: datetime | None = None) -> Assigned:
        session.credits -= 1
        lease_token = new_lease_token()
        self._claimed.add(run.run_id)
        self._in_flight.assign((run.run_id, lease_token), session, run, ordinary=self._reserve.ordinary(run))
        self._metrics.dispatch_lag.observe(max((now - run.available_at).total_seconds(), 0.0))
        # A keyed run claims its place under the cap in the database before it is sent (.key_gate).
        confirm = confirm_first or run.delivery is Delivery.AT_MOST_ONCE or run.concurrency_key is not None
        return Assigned(run=run, attempt=run.attempts + 1, lease_token=lease_token, released_at=now, confirm_first=confirm,
                        start_at=start_at)

    def _assign_ready(self, session: WorkerSession) -> None:
        if not self._assigning:
            return
        now = self._clock.now()
        assigned: list[Assigned] = []
        for job_type in session.job_types:
            queue = self._ready.get(job_type)
            # A worker of one tenant takes only that tenant's runs; the others' wait their turn.
            # Its last credits (the reserve) go to urgent runs only.
            while queue and session.credits > 0:
                urgent_only = not self._reserve.ordinary_room(session)
                if urgent_only and not queue.has_urgent():
                    break
                if (waiting := queue.pop(session.tenant, self._tenant_full, urgent_only=urgent_only)) is None:
                    break
                self._queued.discard(waiting.run.run_id)
                self._ready_bytes[job_type] -= len(waiting.run.payload)
                if waiting.run.run_id in self._claimed:
                    continue
                if self._gate.has_blocked(waiting.run):
                    self._gate.block([waiting.run])
                    continue
                assigned.append(self._assign(session, waiting.run, now, waiting.confirm_first))
            self._parked.refill(job_type)
        if assigned:
            self._send(session, assigned)

    # -- sending --------------------------------------------------------------------------------

    def _send(self, session: WorkerSession, assigned: list[Assigned]) -> None:
        fast = [item for item in assigned if not item.confirm_first]
        confirmed = [item for item in assigned if item.confirm_first]
        if fast:
            self._journal.pending.dispatches.extend(self._helpers.dispatch_of(session, item) for item in fast)
            self._journal.wake()
            session.outbox.put_nowait(Assign(fast))
        if confirmed:
            self._confirmed.send(session, confirmed)

    # -- what workers report --------------------------------------------------------------------

    def heartbeats(self, session: WorkerSession, beats: Iterable[Heartbeat]) -> None:
        refused: list[AttemptKey] = []
        pending = self._journal.pending  # not swapped meanwhile: nothing here awaits
        for beat in beats:
            key = (beat.run_id, beat.lease_token)
            if self._vouch(session, key, refused, pending.unvouched):
                pending.heartbeats[key] = (session, beat)
        self._log_refused(session, "heartbeats", refused)
        self._journal.wake()

    def results(self, session: WorkerSession, results: Iterable[AttemptResult]) -> None:
        refused: list[AttemptKey] = []
        pending = self._journal.pending  # not swapped meanwhile: nothing here awaits
        for result in results:
            key = (result.run_id, result.lease_token)
            if self._vouch(session, key, refused, pending.unvouched):
                self._in_flight.pop(key, None)
                self._gate.ended(key)
                pending.results.append((session, result))
        self._log_refused(session, "results", refused)
        self._journal.wake()
        self._gate.prune(self._in_flight)
        # A tenant at its cap, or a stream full of ordinary runs, may have room again: assign their
        # waiting runs out on the credits already free.
        if self._tenant_caps or self._reserve:
            for session in {id(s): s for sessions in self._sessions.values() for s in sessions if s.credits}.values():
                self._assign_ready(session)

    def _vouch(self, session: WorkerSession, key: AttemptKey, refused: list[AttemptKey],
               unvouched: set[tuple[str, str, int]]) -> bool:
        """Whether a report for this attempt may go to the journal: refused at once when this
        node sent the attempt to another worker; when it did not send it at all (it went out
        before a reconnect, or from another node), marked for a check against the database."""
        holder = self._in_flight.get(key)
        if holder is None:
            unvouched.add((session.worker_id, *key))
        elif holder.worker_id != session.worker_id:
            refused.append(key)
            return False
        return True

    @staticmethod
    def _log_refused(session: WorkerSession, kind: str, refused: list[AttemptKey]) -> None:
        if refused:
            run_id, lease_token = refused[0]
            log.warning("refused %d %s from worker %s for attempts sent to another worker (first: run %s, token %d)",
                        len(refused), kind, session.worker_id, run_id, lease_token)

    # -- the journal writer ---------------------------------------------------------------------

    async def run(self) -> None:
        """Flush the journal until stopped and drained (see :meth:`Journal.run`)."""
        await self._journal.run()

    async def flush(self, timeout: float) -> None:
        """Wait until the journal is empty (or the timeout passes)."""
        await self._journal.flush(timeout)

    async def journal_written(self, timeout: float) -> None:
        """Wait until what was journalled before this call is written (or the timeout passes)."""
        await self._journal.written(timeout)

    def stop(self) -> None:
        """Let :meth:`run` return once the journal is drained (or ``JOURNAL_STOP_GRACE`` passed)."""
        self._journal.stop()


class _Helpers:
    """The dispatcher as its helpers see it: the :class:`~.parked_runs.ReadyQueues` parked runs are
    read back into, the :class:`~.key_gate.GateDispatcher` blocked runs are offered to, and the
    :class:`~.confirmed_sender.SenderDispatcher` of runs sent confirmed first."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    @property
    def assigning(self) -> bool:
        return self._dispatcher._assigning

    def room(self, job_type: str) -> int:
        d = self._dispatcher
        return 0 if d._ready_bytes[job_type] >= d._max_ready_bytes else max(d._max_ready - len(d._ready.get(job_type, ())), 0)

    def half_empty(self, job_type: str) -> bool:
        d = self._dispatcher
        return len(d._ready.get(job_type, ())) <= d._max_ready // 2 and d._ready_bytes[job_type] <= d._max_ready_bytes // 2

    def read_back(self, runs: list[Run]) -> None:
        self._dispatcher._assign_or_queue(runs, confirm_first=True, reloaded=True)

    def offer_blocked(self, runs: list[Run]) -> None:
        self._dispatcher._assign_or_queue(runs, confirm_first=True, reloaded=True, offered=True)

    async def journal_written(self, timeout: float) -> None:
        await self._dispatcher.journal_written(timeout)

    def dispatch_of(self, session: WorkerSession, item: Assigned) -> Dispatch:
        cap = None if (key := item.run.concurrency_key) is None else KeyCap(item.run.tenant, key,
                                                                             item.run.concurrency_limit or 1)
        return Dispatch(run_id=item.run.run_id, lease_token=item.lease_token, worker_id=session.worker_id,
                        node_id=self._dispatcher._node_id, lease_ttl=item.run.lease_ttl,
                        dispatched_at=item.released_at, cap=cap)

    def set_aside(self, dispatch: Dispatch, error: Exception) -> None:
        self._dispatcher._journal.dispatch_set_aside(dispatch, error)

    def assign_ready(self, session: WorkerSession) -> None:
        self._dispatcher._assign_ready(session)
