"""The worker of ``fastlane bench workflow``: handles every step (job type ``bench.step``) at once
and writes, per run, one line when its handler starts and one when it ends:

``S <run_id> <workflow_run_id> <step> <start µs>`` and ``E <run_id> <workflow_run_id> <step> <end µs>``

(wall clock, this machine's: the node, the worker and the harness share it). Run as ``fastlane
worker fastlane.bench.workflow_worker:worker`` with FASTLANE_BENCH_RECORD set.
"""

from __future__ import annotations

import os
import time

from fastlane.worker import RunContext, Worker

worker = Worker(concurrency=2_000)
_record = open(os.environ["FASTLANE_BENCH_RECORD"], "a", buffering=1)  # noqa: SIM115 - lives as long as the process


@worker.handler("bench.step")
async def step(ctx: RunContext) -> None:
    given = ctx.json()
    key = f"{ctx.run_id} {given['workflow_run_id']} {given['step']}"
    _record.write(f"S {key} {time.time_ns() // 1000}\n")
    _record.write(f"E {key} {time.time_ns() // 1000}\n")
