"""What the dispatcher sends a worker (assignments, acknowledgements, cancels, clock echoes) and the
connected worker stream it sends them to."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from fastlane.domain.models import Run

AttemptKey = tuple[str, int]  # (run_id, lease_token)


@dataclass(frozen=True, slots=True)
class Assigned:
    """One run sent to a worker as a new attempt."""

    run: Run
    attempt: int
    lease_token: int
    released_at: datetime
    confirm_first: bool
    start_at: datetime | None = None  # sent ahead: the worker starts it at this instant (node clock)


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
    unstarted_only: bool = False  # a withdrawal: only attempts still held for their start_at are dropped


@dataclass(frozen=True, slots=True)
class ClockEcho:
    """The answer to a worker's clock probe: this node's time when the probe was read."""

    probe_id: int
    probe_sent_at_ns: int | None  # exactly as the probe carried it (the worker matches it)
    node_time: datetime


Outgoing = Assign | Acknowledge | Cancel | ClockEcho


@dataclass(eq=False)
class WorkerSession:
    """One connected worker stream. ``outbox`` is drained by the gRPC servicer."""

    worker_id: str
    job_types: frozenset[str]
    tenant: str | None
    credits: int
    outbox: asyncio.Queue[Outgoing] = field(default_factory=asyncio.Queue)
    connected: bool = True
    draining: bool = False  # the worker is stopping (Drain): it has no credits and is granted none
    # The worker's last reported clock estimate against this node's (None: none reported yet).
    clock_uncertainty: timedelta | None = None
    clock_offset: timedelta | None = None
