"""Operating a real daemon: the CLI as a user types it, metrics, health and graceful shutdown."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
from e2e_support import ROOT, Daemon, Recorder, child_environment, wait_for

from fastlane.storage import open_store
from fastlane.testing.processes import summed

pytestmark = pytest.mark.e2e


def cli(daemon: Daemon, *args: str) -> object:
    """Run ``fastlane ARGS --server ADDRESS --json`` and return its parsed output."""
    completed = subprocess.run(
        [sys.executable, "-m", "fastlane", *args, "--server", daemon.address, "--json"],
        capture_output=True, env=child_environment(), cwd=ROOT, timeout=60,
    )
    assert completed.returncode == 0, completed.stderr.decode()
    return orjson.loads(completed.stdout)


async def test_cli_creates_a_job_and_lists_its_runs(daemon: Daemon, recorder: Recorder):
    created = cli(daemon, "jobs", "create", "--name", "cli-job", "--type", "e2e", "--every", "0.5",
                  "--payload", '{"from": "cli"}')
    job_id = created["job_id"]
    await wait_for(lambda: len(recorder.received_for(job_id)) >= 2, 20, "runs of the job made with the CLI")

    def finished_runs() -> list:
        runs = cli(daemon, "runs", "list", "--job", job_id, "--state", "succeeded", "--limit", "10")
        return runs if len(runs) >= 2 else []

    runs = await wait_for(finished_runs, 20, "two succeeded runs in history")
    for run in runs:
        assert {"run_id", "job_id", "scheduled_for", "state", "attempts"} <= set(run)
        assert run["job_id"] == job_id and run["state"] == "succeeded" and run["attempts"] == 1
    detail = cli(daemon, "runs", "get", runs[0]["run_id"])
    assert detail["attempts"][0]["outcome"] == "succeeded"


async def test_metrics_report_lag_outcomes_heap_and_workers(daemon: Daemon, recorder: Recorder, client):
    from datetime import timedelta

    from fastlane.domain.models import Schedule

    await client.create("metered", "e2e", Schedule.interval(timedelta(milliseconds=200)))

    def settled() -> dict[str, float] | None:
        samples = daemon.metrics()
        done = summed(samples, "fastlane_runs_total", outcome="succeeded")
        return samples if done >= 3 and samples.get("fastlane_workers_connected") == 1 else None

    samples = await wait_for(settled, 20, "metrics of three succeeded runs")
    # Runs by outcome, job type and tenant; the lag resolved from 20 microseconds up to minutes.
    assert summed(samples, "fastlane_runs_total", outcome="succeeded", job_type="e2e", tenant="default") >= 3
    assert 'fastlane_trigger_lag_seconds_bucket{le="2e-05"}' in samples
    assert 'fastlane_trigger_lag_seconds_bucket{le="120.0"}' in samples
    assert samples["fastlane_trigger_lag_seconds_count"] >= 3
    assert samples["fastlane_heap_size"] >= 1
    assert samples["fastlane_shards_owned"] == 8
    assert "fastlane_ready_queue_depth" in samples


async def test_sigterm_hands_every_shard_back(db_url: str, daemon: Daemon):
    assert daemon.stop() == 0, daemon.log_tail()
    store = open_store(db_url)
    try:
        shards = await store.shards.list_shards()
    finally:
        await store.close()
    assert shards and all(shard.owner == "" for shard in shards), daemon.log_tail()


async def test_the_dashboard_and_the_alert_rules_read_only_metrics_a_live_node_exports(daemon: Daemon):
    """Scrapes the real node: a metric renamed in the code fails here, not on an operator's dashboard."""
    import json
    import re
    import urllib.request
    from pathlib import Path

    import yaml
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{daemon.metrics_address}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    exported: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        exported.add(family.name)
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",)}.get(family.type, ())
        exported.update(family.name + suffix for suffix in suffixes)
    deploy = Path(ROOT) / "deploy"
    rules = yaml.safe_load((deploy / "prometheus" / "fastlane-alerts.yaml").read_text())
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((deploy / "grafana" / "fastlane-dashboard.json").read_text())
    expressions += [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = {name for expression in expressions for name in re.findall(r"\bfastlane_[a-z_]+\b", expression)}
    assert len(used) > 20
    assert used <= exported, f"named but not exported by the node: {sorted(used - exported)}"
