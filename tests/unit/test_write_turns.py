"""SQLite's write turns: one writer at a time, lease upkeep served before queued data writes."""

from __future__ import annotations

import asyncio

from fastlane.storage.turns import WriteTurns


async def test_urgent_waiters_go_before_earlier_normal_ones_and_turns_never_overlap():
    turns = WriteTurns()
    order: list[str] = []
    inside = 0
    release_first = asyncio.Event()

    async def write(name: str, *, urgent: bool = False, hold: asyncio.Event | None = None) -> None:
        nonlocal inside
        async with turns.turn(urgent=urgent):
            inside += 1
            assert inside == 1, "two writers at once"
            order.append(name)
            if hold is not None:
                await hold.wait()
            await asyncio.sleep(0)
            inside -= 1

    first = asyncio.create_task(write("batch-1", hold=release_first))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(write(f"batch-{n}")) for n in (2, 3)]
    await asyncio.sleep(0)
    renewal = asyncio.create_task(write("renewal", urgent=True))
    await asyncio.sleep(0)
    release_first.set()
    await asyncio.gather(first, *queued, renewal)
    assert order == ["batch-1", "renewal", "batch-2", "batch-3"]


async def test_a_cancelled_waiter_does_not_keep_the_turn():
    turns = WriteTurns()
    holding = asyncio.Event()
    done = asyncio.Event()

    async def hold() -> None:
        async with turns.turn():
            holding.set()
            await done.wait()

    async def wait_turn() -> None:
        async with turns.turn():
            pass

    holder = asyncio.create_task(hold())
    await holding.wait()
    cancelled = asyncio.create_task(wait_turn())
    await asyncio.sleep(0)
    cancelled.cancel()
    done.set()
    await holder
    await asyncio.wait_for(wait_turn(), timeout=1)  # the turn is free again
    assert cancelled.cancelled()
