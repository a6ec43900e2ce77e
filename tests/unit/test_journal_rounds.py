"""A journal round of more than one kind (dispatches, heartbeats, results) is one transaction; one
that fails for its data is written again kind by kind, so the bad record is still found alone."""

from __future__ import annotations

import asyncio
from collections import Counter

from test_journal_split import WAIT, ScriptedStore, dispatcher_on, drained, result_for, run_named, sent, set_aside

from fastlane.engine.dispatch import Acknowledge, Assign
from fastlane.runtime.metrics import Metrics


def pending_round(dispatcher, names: list[str], reported: list[str]):  # type: ignore[no-untyped-def]
    """Runs ``names`` released and sent to a worker, the results of ``reported`` among them in:
    all pending in one batch, for the journal started after this."""
    session = dispatcher.connect("w", ["t"], len(names), None)
    dispatcher.release([run_named(name) for name in names])
    tokens = {item.run.run_id: item.lease_token for message in sent(session, Assign) for item in message.runs}
    dispatcher.results(session, [result_for(name, tokens[name]) for name in reported])
    return session


async def test_dispatches_and_results_pending_together_are_one_round():
    store = ScriptedStore()
    dispatcher = dispatcher_on(store)
    session = pending_round(dispatcher, ["a", "b", "c"], ["a", "b"])
    journal = asyncio.create_task(dispatcher.run())
    await dispatcher.flush(WAIT)
    assert store.calls == Counter({"rounds": 1, "dispatches": 1, "results": 1})
    assert [d.run_id for d in store.dispatched] == ["a", "b", "c"]
    assert sorted(r.run_id for r in store.recorded) == ["a", "b"]
    assert {ref.run_id for message in sent(session, Acknowledge) for ref in message.results} == {"a", "b"}
    await drained(dispatcher, journal)


async def test_a_round_with_a_poisoned_result_lands_the_rest_once_and_sets_that_one_aside():
    store, metrics = ScriptedStore(), Metrics()
    dispatcher = dispatcher_on(store, metrics)
    session = pending_round(dispatcher, ["a", "poison-b", "c"], ["a", "poison-b", "c"])
    journal = asyncio.create_task(dispatcher.run())
    await dispatcher.flush(WAIT)
    assert store.calls["rounds"] == 1  # it failed whole, then each kind went apart
    # The dispatch of poison-b fails alone too (the scripted store refuses its id anywhere).
    assert [d.run_id for d in store.dispatched] == ["a", "c"]
    assert sorted(r.run_id for r in store.recorded) == ["a", "c"]
    assert {ref.run_id for message in sent(session, Acknowledge) for ref in message.results} == {"a", "c"}
    assert set_aside(metrics) == 2  # poison-b's dispatch and its result
    await drained(dispatcher, journal)


async def test_a_round_the_database_refuses_for_now_is_written_whole_when_it_returns():
    store, metrics = ScriptedStore(down=1), Metrics()
    dispatcher = dispatcher_on(store, metrics)
    session = pending_round(dispatcher, ["a", "b"], ["a"])
    journal = asyncio.create_task(dispatcher.run())
    await dispatcher.flush(WAIT)
    assert store.calls["rounds"] == 2 and store.calls["dispatches"] == 2  # the failed try, then the round
    assert [d.run_id for d in store.dispatched] == ["a", "b"] and [r.run_id for r in store.recorded] == ["a"]
    assert {ref.run_id for message in sent(session, Acknowledge) for ref in message.results} == {"a"}
    assert set_aside(metrics) == 0
    await drained(dispatcher, journal)
