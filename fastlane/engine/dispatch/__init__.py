"""Dispatch: ready queues, worker sessions with credits, and the journal of what happened.

Each module is named after its class: :mod:`.dispatcher` (:class:`Dispatcher`, which assigns and
sends), :mod:`.ready_queue` (``ReadyQueue``), :mod:`.key_gate` (``KeyGate``: runs blocked by their
concurrency key), :mod:`.parked_runs` (``ParkedRuns``), :mod:`.reserve` (``Reserve``: credits kept
for urgent runs), :mod:`.in_flight` (``InFlight``), :mod:`.confirmed_sender` (``ConfirmedSender``),
:mod:`.send_ahead` (``SendAhead``), :mod:`.journal` (``Journal``: the record stage), what is sent
to a worker in :mod:`.messages`, lease tokens in :mod:`.lease_tokens`, the dispatcher's gauges
(ready depths, blocked and unserved runs) in :mod:`.gauges`. The words are those of the
glossary in :mod:`fastlane.engine`.

A released run goes straight to a connected worker that declared its job type and has a free
credit; otherwise it waits in the ready queue of its type until one does.

Two ways to send:

- *fast*: the run was written by this node a moment ago (or triggered, or retried through it),
  so no one else can have it. It is sent at once; its dispatch goes to a *journal* that one
  writer task flushes in batches, in order (a result is never written before its dispatch).
- *confirmed*: the run came back from the database (a rebuild, an expired lease) or is
  at-most-once. Its dispatch is written first and it is sent only if that write took it from
  ``scheduled`` — the database, not memory, decides that nobody else has it.

A run is *claimed* from the moment it is assigned until its dispatch is durable; a second
release of a claimed run is dropped. Results are acknowledged to the worker only once durable.

Sent *ahead* (:mod:`.send_ahead`): a run due within ``--send-ahead`` may go early, fast, to a worker
whose clock is known within that lead, with the instant to start it; the worker holds it until
then. Runs to be confirmed first, and workers that do not measure their clock, keep the instant.

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

from fastlane.engine.dispatch.dispatcher import Dispatcher
from fastlane.engine.dispatch.journal import JOURNAL_STOP_GRACE
from fastlane.engine.dispatch.lease_tokens import MAX_LEASE_TOKEN
from fastlane.engine.dispatch.messages import (
    Acknowledge,
    Assign,
    Assigned,
    AttemptRef,
    Cancel,
    Outgoing,
    WorkerSession,
)

# What modules outside the package import; inside fastlane.engine and fastlane.server, import
# from the submodules themselves.
__all__ = [
    "JOURNAL_STOP_GRACE",
    "MAX_LEASE_TOKEN",
    "Acknowledge",
    "Assign",
    "Assigned",
    "AttemptRef",
    "Cancel",
    "Dispatcher",
    "Outgoing",
    "WorkerSession",
]
