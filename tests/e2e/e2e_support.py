"""Helpers for the end-to-end tests: the recording worker, waiting, and reading what happened.

A plain module (not conftest.py) so that tests import it by a name no other test folder uses:
``from e2e_support import Recorder, wait_for``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import orjson

from fastlane.client import Client
from fastlane.testing import until as wait_for  # noqa: F401  (the suite's one wait, by the name these tests use)
from fastlane.testing.processes import (  # noqa: F401
    ROOT,
    Daemon,
    Process,
    WorkerProcess,
    child_environment,
    free_port,
)

HERE = Path(__file__).resolve().parent


class Recorder(WorkerProcess):
    """The recording worker and the runs it has received."""

    def __init__(self, address: str, record_path: Path, log_path: Path) -> None:
        self.record_path = record_path
        env = child_environment(HERE, FASTLANE_RECORD_FILE=str(record_path))
        super().__init__("recording_worker:worker", [address], log_path, env=env)

    def received(self) -> list[dict]:
        return read_records(self.record_path)

    def received_for(self, job_id: str) -> list[dict]:
        return [entry for entry in self.received() if entry["job_id"] == job_id]


def read_records(path: Path) -> list[dict]:
    """A worker's JSON-lines file so far (none yet: empty); a last line the worker is still
    writing (no newline yet) is left for the next read."""
    if not path.exists():
        return []
    complete = path.read_bytes().rpartition(b"\n")[0]
    return [orjson.loads(line) for line in complete.splitlines() if line.strip()]


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


def recorded_events(recorder: Recorder, job_id: str | None = None, event: str | None = None) -> list[dict]:
    """What the recording worker's handlers did after receiving runs (its ``.events`` file)."""
    entries = read_records(Path(f"{recorder.record_path}.events"))
    return [
        entry for entry in entries
        if (job_id is None or entry["job_id"] == job_id) and (event is None or entry["event"] == event)
    ]


def start_recorder(address: str, tmp_path: Path, processes: list[Process], name: str) -> Recorder:
    """Another recording worker, with its own record file ``NAME.jsonl`` and log ``NAME.log``."""
    worker = Recorder(address, tmp_path / f"{name}.jsonl", tmp_path / f"{name}.log")
    worker.start()
    processes.append(worker)
    return worker


async def workers_connected(client: Client) -> int:
    status = await client.cluster()
    return sum(node.workers_connected for node in status.nodes)


async def all_runs(client: Client, job_id: str) -> list:  # type: ignore[type-arg]
    """Every run of a job, oldest scheduled time first."""
    runs, token = [], ""
    while True:
        page = await client.list_runs(job_id=job_id, page_size=1000, page_token=token)
        runs.extend(page.items)
        token = page.next_page_token
        if not token:
            return sorted(runs, key=lambda run: (run.scheduled_for, run.run_id))


def run_cli(daemon: Daemon, *args: str) -> object:
    """Run ``fastlane ARGS --server ADDRESS --json`` as a user would and return its parsed output."""
    import subprocess
    import sys

    completed = subprocess.run(
        [sys.executable, "-m", "fastlane", *args, "--server", daemon.address, "--json"],
        capture_output=True, env=child_environment(), cwd=ROOT, timeout=60, check=False,
    )
    assert completed.returncode == 0, completed.stderr.decode()
    return orjson.loads(completed.stdout)


def uncertainty_bound(node: Daemon) -> timedelta:
    """An upper bound of every clock uncertainty the workers have reported: the smallest bucket of
    the node's histogram that holds them all."""
    samples = node.metrics()
    prefix = "fastlane_worker_clock_uncertainty_seconds"
    total = samples[f"{prefix}_count"]
    bounds = [float(name.partition('le="')[2].rstrip('"}')) for name, value in samples.items()
              if name.startswith(f"{prefix}_bucket") and value >= total > 0]
    return timedelta(seconds=min(bounds))
