"""Sending runs ahead of their instant: which worker sessions may hold them, and withdrawals.

A worker that measures its clock against this node's sends clock probes; each is answered at
once with this node's time, and each carries the worker's current estimate (offset and
uncertainty, or none yet). A run due within the lead (``--send-ahead``) may be sent to a session
whose last reported uncertainty is known and within the lead, with ``start_at`` set to the run's
instant: the worker holds it and starts the handler then, so the send's latency is no longer
part of the run's lag. Sessions that never probe (older workers), or whose estimate is looser
than the lead, get runs on the instant as before.

A run sent ahead is an ordinary fast dispatch: journalled, leased, and withdrawn by the journal
if the database refuses it. Before its instant:

- a cancelled run is stopped by the usual CancelRuns, held or started alike;
- a deleted job's runs already sent keep running (deleting a job stops what is not yet sent),
  except attempts still held for their ``start_at``: those are withdrawn with
  ``CancelRuns(unstarted_only)``, which a worker applies only to attempts not yet started.

Losing a shard needs no withdrawal. An attempt sent ahead holds its own lease in the database
(its dispatch took the run from ``scheduled``), and the shard's new owner reads only
``scheduled`` runs, each confirmed in the database before it is sent: it does not deliver the
run again while that lease is live, so the held attempt starts on its instant as if the shard
had not moved, and reports to whichever node the worker reaches. If this node's dispatch had not
landed yet and the new owner's confirmed one wins, the database refuses this node's and the
journal withdraws it from the worker (a full CancelRuns), as for any fast send.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from fastlane.engine.dispatch.messages import AttemptKey, AttemptRef, ClockEcho, WorkerSession
from fastlane.runtime.clock import Clock
from fastlane.runtime.metrics import Metrics

_NO_LEAD = timedelta(0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockProbe:
    """A worker's clock probe, validated: its estimate of its clock against this node's, if any yet."""

    probe_id: int
    sent_at_ns: int | None  # the worker's clock, nanoseconds since the epoch: echoed back exactly
    uncertainty: timedelta | None  # None: no estimate yet
    offset: timedelta | None  # node minus worker


class SendAhead:
    """The sessions that can hold runs sent ahead, and the attempts held by workers now."""

    def __init__(self, lead: timedelta, *, clock: Clock, metrics: Metrics) -> None:
        self.lead = lead
        self._clock = clock
        self._metrics = metrics
        self._capable: set[WorkerSession] = set()
        self._wake: Callable[[], None] | None = None
        # Attempts sent ahead: (job id, start_at), in the order sent (about the order of their
        # start_at, as the lane offers runs in time order); those past their start are pruned.
        self._held: dict[AttemptKey, tuple[str, datetime]] = {}

    @property
    def usable_lead(self) -> timedelta:
        """The lead while a connected worker can hold runs, else zero."""
        return self.lead if self._capable else _NO_LEAD

    def can_hold(self, session: WorkerSession) -> bool:
        return session in self._capable

    def watch(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when a first session becomes able to hold runs (the lane's timer may be
        sleeping until an instant it could now send ahead of)."""
        self._wake = wake

    def probed(self, session: WorkerSession, probe: ClockProbe) -> None:
        """Echo the probe at once with this node's time, and take the worker's estimate as
        reported (only the last one counts)."""
        session.outbox.put_nowait(ClockEcho(probe.probe_id, probe.sent_at_ns, self._clock.now()))
        uncertainty = probe.uncertainty
        session.clock_uncertainty, session.clock_offset = uncertainty, probe.offset
        if uncertainty is not None:
            self._metrics.worker_clock_uncertainty.observe(uncertainty.total_seconds())
            if probe.offset is not None:
                self._metrics.worker_clock_offset.observe(abs(probe.offset.total_seconds()))
        if self.lead and uncertainty is not None and uncertainty <= self.lead and session.connected:
            if session not in self._capable:
                first = not self._capable
                self._capable.add(session)
                if first and self._wake is not None:
                    self._wake()
        else:
            self._capable.discard(session)

    def disconnected(self, session: WorkerSession) -> None:
        self._capable.discard(session)

    def sent(self, key: AttemptKey, job_id: str, start_at: datetime, now: datetime) -> None:
        """Note an attempt sent ahead; forget those whose start has passed (amortised: oldest first)."""
        held = self._held
        while held:
            oldest = next(iter(held))
            if held[oldest][1] > now:
                break
            del held[oldest]
        held[key] = (job_id, start_at)

    def withdrawals(
        self, job_id: str, now: datetime, in_flight: Mapping[AttemptKey, WorkerSession]
    ) -> list[tuple[WorkerSession, list[AttemptRef]]]:
        """The attempts of ``job_id`` sent ahead and not yet due to start, by connected session."""
        by_session: dict[int, tuple[WorkerSession, list[AttemptRef]]] = {}
        for key in [key for key, (held_job, _) in self._held.items() if held_job == job_id]:
            _, start_at = self._held.pop(key)
            session = in_flight.get(key)
            if start_at > now and session is not None and session.connected:
                by_session.setdefault(id(session), (session, []))[1].append(AttemptRef(*key))
        return list(by_session.values())
