"""The running scheduler inside a node: shard leases (:mod:`.shards`), the fast lane that fires due
work (:mod:`.lane`), dispatch to workers (:mod:`.dispatch`), routing of other nodes' changes
(:mod:`.changes`), and the user-facing steps both the servicers and change routing take
(:mod:`.operations`).

**The fire path, stage by stage** (from timer to worker stream; each stage's collaborators are
small Protocols declared beside it, which a test fakes in a few lines):

1. *Load the window* — :mod:`.window`, :class:`~.window.WindowLoader`: the jobs of owned shards due
   within the window (10 s ahead, a lane setting) are read into memory, whole on acquisition, then only what enters it.
2. *Plan* — :mod:`.write_ahead` (the planned heap of :class:`~.write_ahead.WriteAhead`), deciding
   with :func:`fastlane.domain.policies.plan_occurrence`; a queue over its backlog limit
   (:mod:`.backlog`, :class:`~.backlog.BacklogLimits`) has its due jobs *deferred*.
3. *Write ahead* — :mod:`.write_ahead`, :class:`~.write_ahead.WriteAhead`: a lead before they are
   due, the runs are written in fenced batches (:mod:`.fencing`) and the jobs advanced.
4. *Release on time* — :mod:`.release`, :class:`~.release.ReleaseTimer`: written runs wait for their
   instant; the timer *releases* each to the dispatcher then, or *offers* it a little before.
5. *Send ahead* — :mod:`.dispatch.send_ahead`, :class:`~.dispatch.send_ahead.SendAhead`: a run
   offered ahead is sent early, with its instant, to a worker whose clock is known; the worker
   *holds* it until then.
6. *Dispatch* — :mod:`.dispatch.dispatcher`, :class:`~.dispatch.dispatcher.Dispatcher`: a released
   run is *assigned* to a worker session with a free credit (a new attempt with its lease token)
   and *sent* on its stream, fast or confirmed first (:mod:`.dispatch.confirmed_sender`); else it
   waits in its job type's :mod:`.dispatch.ready_queue`, *blocked* by a cap
   (:mod:`.dispatch.key_gate`) or *parked* in the database (:mod:`.dispatch.parked_runs`).
7. *Record* — :mod:`.dispatch.journal`, :class:`~.dispatch.journal.Journal`: dispatches, heartbeats
   and results are made durable in batches, in order; results are acknowledged once durable.

:class:`~.lane.FastLane` composes stages 1-4 (and sends attempts whose lease expired back to
stage 4); the node wires it to the dispatcher.

**Glossary** (one word, one meaning, across this package):

- *fence* — the :class:`~fastlane.domain.models.ShardLease` a write for a shard is conditioned on;
  its *fence token* (``ShardLease.token``) grows at every acquisition. A shard is *owned* by a
  node while its lease is renewed in time; a refused fence means it is *lost*.
- *lease token* — the random credential of one attempt (``lease_token``, :mod:`.dispatch.lease_tokens`):
  whoever presents ``(run_id, lease_token)`` speaks for the attempt. Never a fence token.
- *API token* — what a client or worker presents to the API (:mod:`fastlane.auth`); *page cursor* —
  what a list call returns to fetch the next page (``page_token`` on the wire). Neither appears
  on the fire path.
- *planned* — a job in the window, waiting to have its runs written; *deferred* — a due job not
  written because its queue is over its backlog limit (``fastlane_write_ahead_held_jobs`` keeps
  its old name); *written* (or *materialised*) — its runs are in the database.
- *release* — the lane hands a due run to the dispatcher on its instant; *offer ahead* — the lane
  hands a run due within ``--send-ahead`` before its instant; *send ahead* — the dispatcher sends
  such a run early; *assign* — a run takes a worker's credit and becomes an attempt; *send* — the
  attempt goes on the worker's stream; *dispatch* — the durable record of an assignment;
  *confirmed first* — sent only once that record took the run from ``scheduled``.
- *held* — only this: a run sent ahead, waiting in a worker for its instant.
- *blocked* — a released run kept back by a cap (its concurrency key, or its tenant's
  ``--tenant-max-in-flight``; ``fastlane_held_runs`` keeps its old name); *queued* — waiting in a
  ready queue for a credit; *parked* — its queue full, only its id kept in memory; *claimed* —
  assigned, its dispatch not yet durable; *in flight* — an attempt sent and not yet reported.
- *recovered* — a run read back from the database (a rebuild, an expired lease, a sweep), always
  confirmed first; *catch-up* — a run already late when the node first had it in memory.
"""
