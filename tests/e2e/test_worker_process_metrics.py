"""``fastlane worker --metrics``: a real worker process, scraped over HTTP as Prometheus would,
while it runs a real daemon's runs, on both backends."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from e2e_support import HERE, Daemon, child_environment, wait_for
from test_run_lifecycle import worker_ready

from fastlane.domain.models import Schedule
from fastlane.testing.processes import Process, WorkerProcess, free_port

pytestmark = pytest.mark.e2e


def scrape(address: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:  # noqa: S310 - a test's own URL
            return answer.read().decode()
    except urllib.error.URLError:
        return ""  # not serving yet


async def test_a_worker_process_serves_its_attempts_on_its_metrics_address(
        daemon: Daemon, client, tmp_path: Path, processes: list[Process]):  # type: ignore[no-untyped-def]
    metrics = f"127.0.0.1:{free_port()}"
    worker = WorkerProcess("recording_worker:worker", [daemon.address], tmp_path / "worker.log",
                           env=child_environment(HERE, FASTLANE_RECORD_FILE=str(tmp_path / "received.jsonl")),
                           extra_args=["--metrics", metrics])
    worker.start()
    processes.append(worker)
    await worker_ready(client)
    for index in range(3):
        await client.create(f"once-{index}", "e2e", Schedule.now())
    succeeded = 'fastlane_worker_attempts_total{job_type="e2e",outcome="succeeded"} 3.0'
    await wait_for(lambda: succeeded in scrape(metrics), 30, "the worker's metrics to count three attempts")
    text = scrape(metrics)
    assert 'fastlane_worker_handler_seconds_count{job_type="e2e"} 3.0' in text
    assert "fastlane_worker_credits_free " in text and "_created" not in text
    assert "worker metrics on http://" in worker.log_tail()
