"""The soak benchmark end to end, briefly: a node and two real workers under its whole mix of jobs,
a worker killed and started again in each slice, every occurrence accounted for.

Long for the default suite (seeding, slices, a lease's wait after the last fault), so it runs with
``make chaos``. The hour for the record is ``fastlane bench soak --hours 1`` (docs/benchmarks.md).
"""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from fastlane.testing.processes import FASTLANE_ROOT, child_environment

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.timeout(600)]


def test_a_short_soak_on_sqlite_loses_nothing_runs_nothing_twice_and_reports_each_slice() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "fastlane", "bench", "soak", "--hours", "0.01", "--json"],
        cwd=FASTLANE_ROOT, env=child_environment(), capture_output=True, timeout=540, check=False)
    assert completed.returncode == 0, completed.stderr.decode()[-3000:]
    [result] = orjson.loads(completed.stdout)["results"]
    assert len(result["slices"]) == 2 and result["faults"] == {"worker": 2, "postgres": 0}
    assert result["occurrences_expected"] > 1_000 and result["workflow_steps_expected"] >= 3
    assert (result["lost"], result["twice"], result["workflow_steps_lost"], result["workflow_steps_twice"]) == (
        0, 0, 0, 0), result["lost_examples"]
    assert all(row["rss_bytes"] and row["open_files"] and row["threads"] for row in result["slices"])
    assert result["slices"][0]["history_trimmed"] > 0  # the seeded old runs were being trimmed
