"""A stopping worker (its Drain) is sent nothing more, whatever credits it granted before."""

from __future__ import annotations

import asyncio

from test_dispatch_fairness import assigned_names, run_of
from test_journal_split import ScriptedStore, dispatcher_on, drained


async def test_a_draining_worker_gets_no_run_and_its_runs_go_to_another():
    dispatcher = dispatcher_on(ScriptedStore())
    journal = asyncio.create_task(dispatcher.run())
    try:
        stopping = dispatcher.connect("stopping", ["t"], 10, None)
        dispatcher.release([run_of("first", "a")])
        assert assigned_names(stopping) == ["first"]
        dispatcher.drain(stopping)
        dispatcher.grant(stopping, 5)  # a grant already on the wire when the worker stopped
        dispatcher.release([run_of("second", "a", due_s=1)])
        assert assigned_names(stopping) == []  # nothing sent since "first" (read above)
        assert dispatcher.ready_depth == 1  # waiting for a worker that takes it
        other = dispatcher.connect("other", ["t"], 1, None)
        assert assigned_names(other) == ["second"]
    finally:
        await drained(dispatcher, journal)


async def test_drain_takes_back_credits_twice_without_harm():
    dispatcher = dispatcher_on(ScriptedStore())
    journal = asyncio.create_task(dispatcher.run())
    try:
        session = dispatcher.connect("w", ["t"], 3, None)
        dispatcher.drain(session)
        dispatcher.drain(session)
        assert (session.credits, session.draining) == (0, True)
        dispatcher.release([run_of("one", "a")])
        assert assigned_names(session) == []
    finally:
        await drained(dispatcher, journal)


async def test_a_tenants_drain_takes_back_only_its_own_streams_credits():
    """Drain acts on the stream it arrives on: another tenant's worker of the same job type keeps
    its credits and its runs."""
    dispatcher = dispatcher_on(ScriptedStore())
    journal = asyncio.create_task(dispatcher.run())
    try:
        mine = dispatcher.connect("acme#w", ["t"], 5, "acme")
        theirs = dispatcher.connect("globex#w", ["t"], 5, "globex")
        dispatcher.drain(mine)
        assert (theirs.credits, theirs.draining) == (5, False)
        dispatcher.release([run_of("acme-run", "acme"), run_of("globex-run", "globex")])
        assert assigned_names(mine) == []
        assert assigned_names(theirs) == ["globex-run"]
        assert dispatcher.ready_depth == 1  # acme's run waits for an acme worker, never globex's
    finally:
        await drained(dispatcher, journal)
