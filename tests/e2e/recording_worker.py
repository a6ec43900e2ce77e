"""A worker for end-to-end tests: records every run it receives as one JSON line.

Run as ``fastlane worker recording_worker:worker`` with FASTLANE_RECORD_FILE set. A payload of
``{"fail": "permanent"}`` or ``{"sleep": seconds}`` changes what the handler does.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime

import orjson

from fastlane.errors import PermanentError
from fastlane.worker import RunContext, Worker

worker = Worker(concurrency=200)
_record = open(os.environ["FASTLANE_RECORD_FILE"], "ab", buffering=0)  # noqa: SIM115 - lives as long as the process


@worker.handler("e2e")
async def record(ctx: RunContext) -> None:
    received = datetime.now(UTC)
    _record.write(orjson.dumps({
        "run_id": ctx.run_id,
        "job_id": ctx.job_id,
        "attempt": ctx.attempt,
        "scheduled_for": ctx.scheduled_for.isoformat(),
        "received_at": received.isoformat(),
        "idempotency_key": ctx.idempotency_key,
        "worker_pid": os.getpid(),
    }) + b"\n")
    instructions = ctx.json() or {}
    if instructions.get("sleep"):
        await asyncio.sleep(float(instructions["sleep"]))
    if instructions.get("fail") == "permanent":
        raise PermanentError("asked to fail")
