"""``fastlane demo``: a daemon on SQLite, a demo worker and a few demo jobs, run for a while.

Everything runs in child processes on 127.0.0.1 and in a temporary directory; all of it is
stopped at the end (or on Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastlane.client import Client
from fastlane.domain.models import Schedule


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Long enough to open the web console it prints and watch runs arrive there.
    parser.add_argument("--duration", type=float, default=300.0, metavar="SECONDS",
                        help="seconds to let the jobs run before the history is printed and everything stops "
                             "(default: %(default).0f; Ctrl-C stops earlier)")
    parser.add_argument("--dir", help="where to keep the demo database and logs (default: a temporary directory)")


def run(args: argparse.Namespace) -> int:
    if args.duration <= 0:
        print("error: --duration must be positive", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fastlane-demo-") as scratch:
        workdir = Path(args.dir or scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        return asyncio.run(_demo(workdir, args.duration))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]  # an AF_INET address: (host, port)
        return port


async def _demo(workdir: Path, duration: float) -> int:
    address = f"127.0.0.1:{_free_port()}"
    metrics = f"127.0.0.1:{_free_port()}"
    console = f"127.0.0.1:{_free_port()}"
    db_url = f"sqlite:///{workdir / 'demo.db'}"
    daemon_log = open(workdir / "daemon.log", "ab")  # noqa: SIM115 - closed in finally
    children: list[subprocess.Popen[bytes]] = []
    # The children have sessions of their own (below), so a closed terminal (SIGHUP) or a kill
    # (SIGTERM) would leave them running: either ends the demo as Ctrl-C does, and it stops them.
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if main is not None:
            loop.add_signal_handler(signum, main.cancel)
    try:
        print(f"starting a daemon on {address} (database {db_url}, metrics http://{metrics}/metrics, "
              f"web console http://{console}/)")
        children.append(subprocess.Popen(
            [sys.executable, "-m", "fastlane", "serve", "--db", db_url, "--listen", address, "--metrics", metrics,
             "--console", console],
            stdout=daemon_log, stderr=subprocess.STDOUT,
            # Sessions of their own: a Ctrl-C at the terminal reaches the demo only, which still
            # reads the history from the daemon before it stops the daemon and the worker.
            start_new_session=True,
        ))
        async with Client(address) as client:
            await client.wait_ready(30)
            print("daemon ready; starting the demo worker (its lines show each run and its start lag)")
            children.append(subprocess.Popen(
                [sys.executable, "-m", "fastlane", "worker", "fastlane.demo.worker:worker", "--server", address],
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
            ))
            jobs = [
                await client.create("demo-report", "demo.report",
                                    Schedule.at_instant(datetime.now(UTC) + timedelta(seconds=3))),
                await client.create("demo-heartbeat", "demo.heartbeat", Schedule.cron_expr("*/2 * * * * *", "UTC")),
                await client.create("demo-sync", "demo.sync", Schedule.interval(timedelta(seconds=3))),
            ]
            for job in jobs:
                print(f"created {job.name:<15} {job.spec.schedule.kind:<8} next fire {job.next_fire_at:%H:%M:%S.%f}"[:-3])
            print(f"running for {duration:.0f} s (Ctrl-C stops early)\n")
            with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
                await asyncio.sleep(duration)
            print("\nhistory:")
            for job in jobs:
                page = await client.list_runs(job_id=job.job_id, page_size=1000)
                states = Counter(run.state.value for run in page.items)
                print(f"  {job.name:<15} {len(page.items):3d} runs  {dict(states)}")
        return 0
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in reversed(children):
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
        daemon_log.close()
