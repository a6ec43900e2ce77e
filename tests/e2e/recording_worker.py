"""A worker for end-to-end tests: records every run it receives as one JSON line.

Run as ``fastlane worker recording_worker:worker`` with FASTLANE_RECORD_FILE set. Each received
attempt is one line of that file, written when its handler starts (with the checkpoint it was
handed, base64, or null, and when its assignment arrived: a run sent ahead arrives earlier). What the
handler does afterwards goes to a second file, FASTLANE_RECORD_FILE + ".events" (one JSON line per
event: ``checkpoint`` after each saved step, ``effect`` after an effect, and ``outcome`` when the
handler ends, with ``result`` one of succeeded, failed, cancelled).

The job's JSON payload steers the handler, in this order:

- ``{"fail_until_attempt": N}``: raise RetryableError while ``ctx.attempt < N``;
- ``{"effect_db": PATH}``: insert one row keyed by the idempotency key into the ``effects`` table
  of that SQLite file with :func:`fastlane.worker.effects.apply_once`; with ``"die_after_effect": true``
  the first attempt then SIGKILLs its own process, so its result is never reported;
- ``{"sleep": S, "checkpoint_every": T}``: S seconds in steps of T, each step saved as the
  checkpoint (the step number), reported as progress and heartbeated; a later attempt resumes
  from the checkpoint it is handed;
- ``{"sleep": S}``: sleep S seconds;
- ``{"fail": "permanent"}``: raise PermanentError.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from fastlane.errors import PermanentError, RetryableError
from fastlane.worker import RunContext, Worker

worker = Worker(concurrency=200)
_record = open(os.environ["FASTLANE_RECORD_FILE"], "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
_events = open(os.environ["FASTLANE_RECORD_FILE"] + ".events", "ab", buffering=0)  # noqa: SIM115 - same


def _event(ctx: RunContext, event: str, **fields: Any) -> None:
    _events.write(orjson.dumps({
        "event": event,
        "run_id": ctx.run_id,
        "job_id": ctx.job_id,
        "attempt": ctx.attempt,
        "idempotency_key": ctx.idempotency_key,
        "at": datetime.now(UTC).isoformat(),
        "worker_pid": os.getpid(),
        **fields,
    }) + b"\n")


@worker.handler("e2e")
async def record(ctx: RunContext) -> None:
    received = datetime.now(UTC)
    entered_monotonic_ns = time.monotonic_ns()  # the real time of entry even where the wall clock is shifted
    _record.write(orjson.dumps({
        "run_id": ctx.run_id,
        "job_id": ctx.job_id,
        "attempt": ctx.attempt,
        "scheduled_for": ctx.scheduled_for.isoformat(),
        "received_at": received.isoformat(),  # when the handler started
        "received_monotonic_ns": entered_monotonic_ns,
        "assignment_received_at": ctx.received_at.isoformat(),  # when the assignment arrived (held until its start)
        "idempotency_key": ctx.idempotency_key,
        "worker_pid": os.getpid(),
        "checkpoint": base64.b64encode(ctx.checkpoint).decode() if ctx.checkpoint is not None else None,
    }) + b"\n")
    instructions = ctx.json() or {}
    if not isinstance(instructions, dict):
        instructions = {}
    try:
        await _follow(ctx, instructions)
    except asyncio.CancelledError:
        _event(ctx, "outcome", result="cancelled")
        raise
    except Exception as error:
        _event(ctx, "outcome", result="failed", error=type(error).__name__)
        raise
    _event(ctx, "outcome", result="succeeded")


async def _follow(ctx: RunContext, instructions: dict[str, Any]) -> None:
    until = instructions.get("fail_until_attempt")
    if until is not None and ctx.attempt < int(until):
        raise RetryableError(f"attempt {ctx.attempt} fails on purpose until attempt {until}")
    if instructions.get("effect_db"):
        await _apply_effect(ctx, instructions["effect_db"])
        if instructions.get("die_after_effect") and ctx.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash after the effect, before the result is sent
    if instructions.get("sleep"):
        seconds = float(instructions["sleep"])
        if instructions.get("checkpoint_every"):
            await _sleep_in_steps(ctx, seconds, float(instructions["checkpoint_every"]))
        else:
            await asyncio.sleep(seconds)
    if instructions.get("fail") == "permanent":
        raise PermanentError("asked to fail")


async def _sleep_in_steps(ctx: RunContext, seconds: float, every: float) -> None:
    total = max(1, round(seconds / every))
    step = int(ctx.checkpoint.decode()) if ctx.checkpoint else 0
    while step < total:
        await asyncio.sleep(every)
        step += 1
        ctx.save_checkpoint(str(step).encode())
        ctx.report_progress(step / total)
        await ctx.heartbeat()
        _event(ctx, "checkpoint", step=step)


async def _apply_effect(ctx: RunContext, path: str) -> None:
    import aiosqlite

    from fastlane.worker.effects import apply_once

    async def insert(tx: Any) -> None:
        await tx.execute(
            "INSERT INTO effects (idempotency_key, attempt, worker_pid) VALUES (?, ?, ?)",
            (ctx.idempotency_key, ctx.attempt, os.getpid()),
        )

    async with aiosqlite.connect(path, isolation_level=None) as db:
        await db.execute("PRAGMA busy_timeout = 10000")
        await db.execute(
            "CREATE TABLE IF NOT EXISTS effects (idempotency_key TEXT NOT NULL, attempt INTEGER NOT NULL, "
            "worker_pid INTEGER NOT NULL)"
        )
        result = await apply_once(db, ctx.idempotency_key, insert)
    _event(ctx, "effect", applied=result.applied)
