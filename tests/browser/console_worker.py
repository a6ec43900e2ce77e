"""The worker of the console's browser tests: one job type that succeeds (reporting progress on
the way), one that always fails."""

from __future__ import annotations

from fastlane.worker import RunContext, Worker

worker = Worker(concurrency=8)


@worker.handler("console.ok")
async def succeed(ctx: RunContext) -> None:
    for step in range(1, 5):
        ctx.report_progress(step / 4)


@worker.handler("console.fail")
async def fail(ctx: RunContext) -> None:
    raise RuntimeError("card declined by the payment gateway")
