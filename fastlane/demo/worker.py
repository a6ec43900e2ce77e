"""The demo's worker: prints each run it runs with its start lag (handler started − scheduled).

Runs sent ahead arrive some milliseconds early and are held until their instant, so the time they
were received says little; when the handler started is what a user of the scheduler sees.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastlane.worker import RunContext, Worker

worker = Worker(concurrency=16)


@worker.handler("demo.report")
@worker.handler("demo.heartbeat")
@worker.handler("demo.sync")
async def show(ctx: RunContext) -> None:
    lag_ms = (ctx.started_at - ctx.scheduled_for).total_seconds() * 1000
    now = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
    print(
        f"{now}  ran {ctx.job_type:<15} scheduled {ctx.scheduled_for.strftime('%H:%M:%S.%f')[:-3]}  "
        f"lag {lag_ms:6.2f} ms  attempt {ctx.attempt}  run {ctx.run_id}",  # whole: `fastlane runs get` takes it
        flush=True,
    )
