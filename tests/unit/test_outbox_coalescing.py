"""What a worker stream sends: queued messages merged, in order, within a size cap."""

from __future__ import annotations

from typing import Any, cast

from fastlane.engine.dispatch import Acknowledge, Assign, AttemptRef, Cancel, WorkerSession
from fastlane.server.servicers.workers import MAX_RUNS_PER_MESSAGE, coalesced


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
