"""The ready queue of a job type: turns across tenants, priority and aging within one."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from fastlane.domain.models import Delivery, Run, RunState
from fastlane.engine.dispatch.ready_queue import AGING_BOUND_SECONDS, ReadyQueue

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Waiting:
    run: Run


def run(name: str, tenant: str = "a", priority: int = 0, due: float = 0.0) -> Waiting:
    at = T0 + timedelta(seconds=due)
    return Waiting(Run(run_id=name, job_id=name, tenant=tenant, job_type="t", shard_id=0, scheduled_for=at,
                       available_at=at, state=RunState.SCHEDULED, attempts=0, payload=b"", priority=priority,
                       manual=False, delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30),
                       created_at=at, updated_at=at))


def drain(queue: ReadyQueue[Waiting], tenant: str | None = None) -> list[str]:
    taken = []
    while (waiting := queue.pop(tenant)) is not None:
        taken.append(waiting.run.run_id)
    return taken


def test_a_tenant_with_a_backlog_takes_turns_with_one_that_arrives_later():
    queue: ReadyQueue[Waiting] = ReadyQueue()
    for i in range(1_000):
        queue.append(run(f"noisy-{i}", "noisy", due=i * 0.001))
    for i in range(3):
        queue.append(run(f"quiet-{i}", "quiet", due=5 + i))
    taken = drain(queue)
    # The quiet tenant's runs are not behind the backlog: every second run is one of them.
    assert taken[:6] == ["noisy-0", "quiet-0", "noisy-1", "quiet-1", "noisy-2", "quiet-2"]
    assert len(taken) == 1_003 and not queue


def test_a_turn_is_as_many_runs_as_the_tenant_weighs():
    queue: ReadyQueue[Waiting] = ReadyQueue(weight=lambda tenant: 3 if tenant == "big" else 1)
    for i in range(6):
        queue.append(run(f"big-{i}", "big", due=i))
        queue.append(run(f"small-{i}", "small", due=i))
    assert [name.split("-")[0] for name in drain(queue)[:8]] == ["big"] * 3 + ["small"] + ["big"] * 3 + ["small"]


def test_within_a_tenant_higher_priority_first_then_the_earliest_due():
    queue: ReadyQueue[Waiting] = ReadyQueue()
    queue.append(run("low", priority=-10, due=0))
    queue.append(run("high-later", priority=100, due=2))
    queue.append(run("high", priority=100, due=1))
    queue.append(run("mid", priority=0, due=0))
    assert drain(queue) == ["high", "high-later", "mid", "low"]


def test_a_low_priority_run_overtakes_newer_high_priority_ones_within_the_aging_bound():
    queue: ReadyQueue[Waiting] = ReadyQueue()
    queue.append(run("oldest-low", priority=-1000, due=0))
    queue.append(run("high-before-the-bound", priority=1000, due=AGING_BOUND_SECONDS - 1))
    queue.append(run("high-after-the-bound", priority=1000, due=AGING_BOUND_SECONDS + 1))
    assert drain(queue) == ["high-before-the-bound", "oldest-low", "high-after-the-bound"]


def test_a_worker_of_one_tenant_takes_only_that_tenants_runs_and_leaves_the_turns_alone():
    queue: ReadyQueue[Waiting] = ReadyQueue()
    for name, tenant in [("a-0", "a"), ("b-0", "b"), ("a-1", "a"), ("b-1", "b")]:
        queue.append(run(name, tenant, due=int(name[-1])))
    assert drain(queue, "b") == ["b-0", "b-1"]
    assert queue.pop("c") is None
    assert drain(queue) == ["a-0", "a-1"]


def test_runs_removed_leave_the_rest_in_order_and_counted():
    queue: ReadyQueue[Waiting] = ReadyQueue()
    for i in range(10):
        queue.append(run(f"a-{i}", "a", due=i))
        queue.append(run(f"b-{i}", "b", due=i))
    removed = queue.remove_if(lambda waiting: waiting.run.tenant == "b" or waiting.run.run_id.endswith(("1", "2")))
    assert len(removed) == 12 and len(queue) == 8
    assert queue.tenant_depths() == {"a": 8}
    assert sorted(w.run.run_id for w in queue) == sorted(f"a-{i}" for i in (0, 3, 4, 5, 6, 7, 8, 9))
    assert drain(queue) == [f"a-{i}" for i in (0, 3, 4, 5, 6, 7, 8, 9)]
    queue.append(replace(run("b-late", "b")))
    assert drain(queue) == ["b-late"]


def test_a_blocked_tenant_is_passed_over_and_keeps_its_runs_for_when_it_has_room():
    queue: ReadyQueue[Waiting] = ReadyQueue()
    for i in range(3):
        queue.append(run(f"capped-{i}", "capped", due=i))
        queue.append(run(f"free-{i}", "free", due=i))
    blocked = {"capped"}
    taken = [w.run.run_id for w in iter(lambda: queue.pop(blocked=blocked.__contains__), None)]
    assert taken == ["free-0", "free-1", "free-2"] and len(queue) == 3
    assert queue.pop("capped", blocked.__contains__) is None  # a tenant's own worker waits too
    blocked.clear()
    assert drain(queue) == ["capped-0", "capped-1", "capped-2"]


def test_the_oldest_due_of_each_tenant_follows_runs_taken_out_in_priority_order():
    queue: ReadyQueue[Waiting] = ReadyQueue()
    queue.append(run("old-low", "a", priority=-100, due=0))
    queue.append(run("new-high", "a", priority=100, due=5))
    queue.append(run("b-0", "b", due=2))
    base = T0.timestamp()
    assert queue.oldest_dues() == {"a": base, "b": base + 2}
    assert queue.pop("a").run.run_id == "new-high"  # taken first; the oldest is still waiting
    assert queue.oldest_dues() == {"a": base, "b": base + 2}
    queue.append(run("a-later", "a", due=9))
    assert queue.pop("a").run.run_id == "old-low"
    assert queue.oldest_dues() == {"a": base + 9, "b": base + 2}
    queue.remove_if(lambda waiting: waiting.run.run_id == "b-0")
    assert queue.oldest_dues() == {"a": base + 9}


def test_urgent_runs_can_be_taken_alone_and_keep_their_order_among_the_others():
    queue: ReadyQueue[Waiting] = ReadyQueue(urgent_priority=100)
    queue.append(run("low-0", "a", priority=-10, due=0))
    queue.append(run("urgent-a", "a", priority=100, due=2))
    queue.append(run("low-1", "b", priority=0, due=1))
    queue.append(run("urgent-b", "b", priority=500, due=3))
    assert queue.has_urgent()
    # Only urgent runs, tenants taking turns; the others stay where they are.
    assert queue.pop(urgent_only=True).run.run_id == "urgent-a"  # type: ignore[union-attr]
    assert queue.pop(urgent_only=True).run.run_id == "urgent-b"  # type: ignore[union-attr]
    assert queue.pop(urgent_only=True) is None and not queue.has_urgent()
    assert len(queue) == 2 and queue.tenant_depths() == {"a": 1, "b": 1}
    assert drain(queue) == ["low-0", "low-1"]


def test_an_ordinary_pop_takes_the_better_of_the_two_heaps_as_one_heap_would():
    plain: ReadyQueue[Waiting] = ReadyQueue()
    split: ReadyQueue[Waiting] = ReadyQueue(urgent_priority=100)
    runs = [run(f"r{i}", priority=priority, due=due)
            for i, (priority, due) in enumerate([(-1000, 0), (100, 10), (0, 1), (1000, 60), (100, 2), (-5, 80)])]
    for waiting in runs:
        plain.append(waiting)
        split.append(waiting)
    assert drain(split) == drain(plain)


def test_urgent_only_for_one_tenant_and_removal_keep_the_counts():
    queue: ReadyQueue[Waiting] = ReadyQueue(urgent_priority=1)
    queue.append(run("a-low", "a", priority=0))
    queue.append(run("a-urgent", "a", priority=1))
    queue.append(run("b-urgent", "b", priority=1))
    assert queue.pop("a", urgent_only=True).run.run_id == "a-urgent"  # type: ignore[union-attr]
    assert queue.pop("a", urgent_only=True) is None
    assert [waiting.run.run_id for waiting in queue.remove_if(lambda waiting: waiting.run.tenant == "b")] == ["b-urgent"]
    assert not queue.has_urgent() and len(queue) == 1 and queue.oldest_dues() == {"a": T0.timestamp()}
