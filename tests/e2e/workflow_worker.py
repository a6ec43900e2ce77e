"""A worker for the workflow end-to-end tests: records every step run it receives as one JSON line.

Run as ``fastlane worker workflow_worker:worker`` with FASTLANE_RECORD_FILE set. It handles the
job type ``wf.step``; the step's ``params`` steer it:

- ``{"fail_until_attempt": N}``: raise RetryableError while ``ctx.attempt < N``;
- ``{"sleep": S}``: sleep S seconds first;
- ``{"output": X}``: return X (else it returns ``{"step": ..., "item": ...}``).

Each line holds the run id, attempt, step, item, workflow run id, the parents' outputs it was
handed, and when the handler started; a second file (``.events``) gets a line when it ends.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from typing import Any

import orjson

from fastlane.errors import RetryableError
from fastlane.worker import RunContext, Worker

worker = Worker(concurrency=200)
_record = open(os.environ["FASTLANE_RECORD_FILE"], "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
_ended = open(os.environ["FASTLANE_RECORD_FILE"] + ".events", "ab", buffering=0)  # noqa: SIM115 - same


@worker.handler("wf.step")
async def step(ctx: RunContext) -> Any:
    given = ctx.json()
    params = given.get("params") or {}
    _record.write(orjson.dumps({
        "run_id": ctx.run_id, "attempt": ctx.attempt, "step": given["step"], "item": given.get("item"),
        "index": given.get("index"), "workflow_run_id": given["workflow_run_id"], "parents": given["parents"],
        "input": given["input"], "started_at": datetime.now(UTC).isoformat(),
    }) + b"\n")
    if params.get("sleep"):
        await asyncio.sleep(float(params["sleep"]))
    until = params.get("fail_until_attempt")
    if until is not None and ctx.attempt < int(until):
        _ended.write(orjson.dumps({"run_id": ctx.run_id, "result": "failed", "at": datetime.now(UTC).isoformat()})
                     + b"\n")
        raise RetryableError(f"attempt {ctx.attempt} fails on purpose until attempt {until}")
    _ended.write(orjson.dumps({"run_id": ctx.run_id, "step": given["step"], "result": "succeeded",
                               "at": datetime.now(UTC).isoformat()}) + b"\n")
    if "output" in params:
        return params["output"]
    return {"step": given["step"], "item": given.get("item")}
