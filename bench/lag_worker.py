"""The benchmark's worker: a no-op handler that writes one line per run it receives.

Each line: run id, scheduled time, release time (node) and receive time (worker), in
microseconds since the epoch, then the job id, then the time the handler was entered (a run the
node sent ahead is received early and started on its instant), then ``cpu_wait_us=N``: how long
the worker's loop thread waited for a CPU since the run before started (see ``cpu_wait``; left
out where the kernel does not say). The file is set by FASTLANE_BENCH_RECORD.
"""

from __future__ import annotations

import os
import time

from fastlane.bench.cpu_wait import CpuWait, record_field

from fastlane.runtime.clock import to_micros
from fastlane.worker import RunContext, Worker

worker = Worker(concurrency=1000)
# Line-buffered: the harness reads the file while the worker runs, and a killed worker loses nothing.
_record = open(os.environ["FASTLANE_BENCH_RECORD"], "a", buffering=1)  # noqa: SIM115 - process lifetime
_cpu_wait = CpuWait()  # made on import, by the thread that runs the event loop and the handlers


@worker.handler("bench.noop")
async def noop(ctx: RunContext) -> None:
    entered = time.time_ns() // 1000  # first: the handler's own view of its start
    waited = _cpu_wait.since_last_us()
    released = to_micros(ctx.released_at) if ctx.released_at else 0
    _record.write(f"{ctx.run_id} {to_micros(ctx.scheduled_for)} {released} {to_micros(ctx.received_at)} "
                  f"{ctx.job_id} {entered}{record_field(waited)}\n")
