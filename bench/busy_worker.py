"""The benchmark's slow worker: a handler that takes a set time, for scenarios that overload the
workers on purpose (``fairness``, ``priority``).

It writes the same line per run as :mod:`fastlane.bench.lag_worker` (run id, scheduled, released,
received, job id, handler entered; microseconds since the epoch), on entering the handler and
before its work, so a run counts as started even if the worker is stopped during it; then the
run's tenant, for a person reading the file (the harness splits runs by job id), and how long the
loop thread waited for a CPU since the run before started (``cpu_wait_us=N``, see
:mod:`fastlane.bench.cpu_wait`). The handler then
sleeps FASTLANE_BENCH_HANDLER_MS milliseconds: with ``--concurrency N`` the worker finishes at most
``N x 1000 / FASTLANE_BENCH_HANDLER_MS`` runs a second per node stream, a capacity known in advance.
With FASTLANE_BENCH_HANDLER_JITTER = J above 0 each sleep is drawn evenly from ``[1 - J, 1 + J]``
times that, the same on average: handlers that all take the same time end in step (see
docs/benchmarks.md, "Handlers in step"). The file is set by FASTLANE_BENCH_RECORD.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

from fastlane.bench.cpu_wait import CpuWait, record_field

from fastlane.runtime.clock import to_micros
from fastlane.worker import RunContext, Worker

worker = Worker(concurrency=10)
_handler_s = int(os.environ.get("FASTLANE_BENCH_HANDLER_MS", "50")) / 1000
_jitter = float(os.environ.get("FASTLANE_BENCH_HANDLER_JITTER", "0"))
# Line-buffered: the harness reads the file while the worker runs, and a killed worker loses nothing.
_record = open(os.environ["FASTLANE_BENCH_RECORD"], "a", buffering=1)  # noqa: SIM115 - process lifetime
_ends = open(os.environ["FASTLANE_BENCH_RECORD"] + ".ends", "a", buffering=1)  # noqa: SIM115 - same
_cpu_wait = CpuWait()  # made on import, by the thread that runs the event loop and the handlers


@worker.handler("bench.busy")
async def busy(ctx: RunContext) -> None:
    entered = time.time_ns() // 1000  # first: the handler's own view of its start
    waited = _cpu_wait.since_last_us()
    released = to_micros(ctx.released_at) if ctx.released_at else 0
    _record.write(f"{ctx.run_id} {to_micros(ctx.scheduled_for)} {released} {to_micros(ctx.received_at)} "
                  f"{ctx.job_id} {entered} {ctx.tenant}{record_field(waited)}\n")
    # The slot stays taken meanwhile, as with real work.
    await asyncio.sleep(_handler_s * random.uniform(1 - _jitter, 1 + _jitter) if _jitter else _handler_s)
    _ends.write(f"{ctx.run_id} {time.time_ns() // 1000}\n")  # when the handler ended (the concurrency scenario)
