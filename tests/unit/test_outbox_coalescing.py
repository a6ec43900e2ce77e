"""What a worker stream sends: queued messages merged, in order, within a size cap; and when a\nworker sends its results."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from fastlane._proto import workers_pb2 as pb
from fastlane.domain.models import Delivery, Run, RunState
from fastlane.engine.dispatch import Acknowledge, Assign, Assigned, AttemptRef, Cancel, WorkerSession
from fastlane.server.servicers.workers import MAX_RUNS_PER_MESSAGE, _to_pb, coalesced
from fastlane.worker._runs import RunBook


def assign(*names: str) -> Assign:
    # The merging looks only at how many runs a message holds, never into them.
    return Assign(cast(Any, list(names)))


def session_with(*queued: object) -> WorkerSession:
    session = WorkerSession(worker_id="w", job_types=frozenset({"t"}), tenant=None, credits=0)
    for message in queued:
        session.outbox.put_nowait(cast(Any, message))
    return session


def test_consecutive_assignments_and_acknowledgements_go_out_as_one_message_each():
    ack = Acknowledge([AttemptRef("r1", 1)])
    session = session_with(assign("b"), assign("c"), ack, Acknowledge([AttemptRef("r2", 2)]), assign("d"))
    sent = coalesced(assign("a"), session)
    assert [type(m).__name__ for m in sent] == ["Assign", "Acknowledge", "Assign"]
    assert sent[0].runs == ["a", "b", "c"] and sent[2].runs == ["d"]
    assert [ref.run_id for ref in sent[1].results] == ["r1", "r2"]
    assert session.outbox.empty()


def test_a_cancel_is_never_merged_past_the_assignment_it_follows():
    cancel = Cancel([AttemptRef("a", 1)], "cancelled")
    sent = coalesced(assign("a"), session_with(cancel, assign("b")))
    assert sent == [Assign(["a"]), cancel, Assign(["b"])]


def test_a_merged_assignment_stops_growing_at_the_cap():
    batch = [f"run-{i}" for i in range(MAX_RUNS_PER_MESSAGE)]
    sent = coalesced(Assign(cast(Any, batch)), session_with(assign("next")))
    assert [len(m.runs) for m in sent] == [MAX_RUNS_PER_MESSAGE, 1]


def test_a_worker_holds_results_to_share_a_message_only_while_the_node_has_credits_for_it():
    from fastlane.worker._stream import RESULT_COALESCE, RESULT_COALESCE_ENOUGH, coalesce_wait

    just_sent = 0.0
    assert coalesce_wait(pending=1, node_credits_left=5, since_last_sent=just_sent) == RESULT_COALESCE
    assert coalesce_wait(pending=1, node_credits_left=0, since_last_sent=just_sent) == 0.0  # every slot busy
    assert coalesce_wait(pending=RESULT_COALESCE_ENOUGH, node_credits_left=5, since_last_sent=just_sent) == 0.0


def test_a_result_after_a_quiet_spell_goes_at_once_and_a_busy_stream_sends_one_message_per_window():
    from fastlane.worker._stream import RESULT_COALESCE, coalesce_wait

    assert coalesce_wait(pending=1, node_credits_left=5, since_last_sent=RESULT_COALESCE * 10) == 0.0
    assert coalesce_wait(pending=1, node_credits_left=5, since_last_sent=RESULT_COALESCE) == 0.0
    waits = coalesce_wait(pending=3, node_credits_left=5, since_last_sent=RESULT_COALESCE / 4)
    assert abs(waits - RESULT_COALESCE * 3 / 4) < 1e-9


def test_a_result_others_wait_on_goes_at_once_even_just_after_a_message():
    from fastlane.worker._stream import RESULT_COALESCE, coalesce_wait

    assert coalesce_wait(pending=2, node_credits_left=5, since_last_sent=0.0) == RESULT_COALESCE
    assert coalesce_wait(pending=2, node_credits_left=5, since_last_sent=0.0, awaited=True) == 0.0


async def test_the_worker_book_says_when_a_pending_result_is_awaited_until_it_is_taken():
    book = RunBook()
    slots = {}

    async def launch(slot: Any, assignment: pb.Assignment, received_at: datetime) -> None:
        slots[assignment.run_id] = slot

    book.start(cast(Any, None), [pb.Assignment(run_id="plain", job_type="t", lease_token=1),
                                 pb.Assignment(run_id="step", job_type="t", lease_token=1, awaited=True)],
               datetime.now(UTC), launch)
    await asyncio.sleep(0)
    book.finish(slots["plain"], pb.RunResult(run_id="plain", lease_token=1))
    assert not book.pending_awaited
    book.finish(slots["step"], pb.RunResult(run_id="step", lease_token=1))
    assert book.pending_awaited
    batch, _ = book.take_pending()
    assert [result.run_id for result in batch] == ["plain", "step"]
    assert not book.pending_awaited


def test_the_node_marks_a_workflow_step_awaited_and_a_plain_run_not():
    now = datetime.now(UTC)
    plain = Run(run_id="plain", job_id="j", tenant="default", job_type="t", shard_id=0, scheduled_for=now,
                available_at=now, state=RunState.SCHEDULED, attempts=0, payload=b"{}", priority=0, manual=False,
                delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30), created_at=now, updated_at=now)
    step = dataclasses.replace(plain, run_id="step", workflow_run_id="wr", step="b")
    sent = _to_pb(Assign([Assigned(run, 1, 1, now, confirm_first=False) for run in (plain, step)]))
    assert [(a.run_id, a.awaited) for a in sent.assignments.assignments] == [("plain", False), ("step", True)]
