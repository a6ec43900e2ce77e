"""The audit trail's group commit: every caller waits for its own event, concurrent callers share
one write, a bad event costs only itself, and a cancelled caller's event is written anyway."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from fastlane.domain.audit import AuditAction, AuditEvent, AuditTarget
from fastlane.domain.errors import StorageUnavailable
from fastlane.engine.audit_trail import AuditTrail
from fastlane.errors import InvalidArgument


def event(target_id: str) -> AuditEvent:
    return AuditEvent(tenant="a", action=AuditAction.CREATED, target_kind=AuditTarget.JOB, target_id=target_id,
                      job_id=target_id)


class SlowStore:
    """Holds each write until released; refuses events whose id starts with 'bad'."""

    @property
    def audit(self) -> SlowStore:  # the part of a store this fake plays
        return self

    def __init__(self, *, unavailable: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()
        self.unavailable = unavailable

    async def record_audit(self, events: Sequence[AuditEvent]) -> None:
        await self.release.wait()
        if self.unavailable:
            raise StorageUnavailable("the database is down (test)")
        if any(e.target_id.startswith("bad") for e in events):
            raise InvalidArgument("target_id", "refused (test)")
        self.batches.append([e.target_id for e in events])


async def test_concurrent_events_share_a_write_and_each_caller_waits_for_its_own():
    store = SlowStore()
    trail = AuditTrail(store)  # type: ignore[arg-type]
    first = asyncio.create_task(trail.record(event("j0")))
    await asyncio.sleep(0)  # the write of j0 is under way
    rest = [asyncio.create_task(trail.record(event(f"j{i}"))) for i in range(1, 10)]
    await asyncio.sleep(0.01)
    assert not first.done() and not any(task.done() for task in rest)  # nothing returns before its write
    store.release.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), 5)
    assert store.batches == [["j0"], [f"j{i}" for i in range(1, 10)]]


async def test_a_refused_event_costs_only_itself(caplog):
    store = SlowStore()
    store.release.set()
    trail = AuditTrail(store)  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger="fastlane.audit")
    await asyncio.wait_for(asyncio.gather(*(trail.record(event(name)) for name in ("j1", "bad", "j2"))), 5)
    assert sorted(target for batch in store.batches for target in batch) == ["j1", "j2"]
    assert [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()][0].count("bad") >= 1


async def test_a_database_outage_is_logged_and_never_fails_the_caller(caplog):
    store = SlowStore(unavailable=True)
    store.release.set()
    caplog.set_level(logging.WARNING, logger="fastlane.audit")
    await asyncio.wait_for(AuditTrail(store).record(event("j1")), 5)  # type: ignore[arg-type]
    assert any("audit event not recorded" in r.getMessage() and "j1" in r.getMessage() for r in caplog.records)


async def test_a_cancelled_caller_event_is_written_anyway():
    store = SlowStore()
    trail = AuditTrail(store)  # type: ignore[arg-type]
    caller = asyncio.create_task(trail.record(event("j1")))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    store.release.set()
    async with asyncio.timeout(5):
        while not store.batches:
            await asyncio.sleep(0.01)
    assert store.batches == [["j1"]]
