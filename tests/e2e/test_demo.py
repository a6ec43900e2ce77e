"""``fastlane demo`` (what ``make demo`` runs) as a person at a terminal would: its runs fire, and a
Ctrl-C stops it early with the history printed, not an error."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastlane.testing.processes import ROOT, child_environment

pytestmark = pytest.mark.e2e

DEADLINE = 60.0


def test_a_ctrl_c_stops_the_demo_with_its_history_and_no_error(tmp_path: Path) -> None:
    # A session of its own: the terminal's Ctrl-C goes to the whole foreground process group,
    # which killpg below does too. The demo's daemon and worker must not die of it first.
    demo = subprocess.Popen(
        [sys.executable, "-m", "fastlane", "demo", "--duration", "40", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_environment(), cwd=ROOT, start_new_session=True,
    )
    try:
        assert demo.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:  # until the worker printed two runs of the cron job (every 2 s)
            line = demo.stdout.readline().decode()
            lines.append(line)
            if sum("ran demo.heartbeat" in seen for seen in lines) == 2:
                break
        else:
            pytest.fail("no two runs within the deadline:\n" + "".join(lines))
        os.killpg(demo.pid, signal.SIGINT)
        out, err = demo.communicate(timeout=DEADLINE)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    shown = "".join(lines) + out.decode()
    assert demo.returncode == 0, err.decode()
    assert "error" not in err.decode().lower(), err.decode()
    history = re.search(r"demo-heartbeat\s+(\d+) runs\s+\{[^}]*'succeeded': (\d+)", shown)
    assert history is not None, shown
    assert int(history.group(2)) >= 1
