"""The worker's event-loop thread under real-time scheduling: granted to that thread alone, lowered
by the runaway guard, refused with a reason without the privilege or off the main thread.

Each case runs in a process of its own: real-time scheduling, the SIGXCPU handler and the
RLIMIT_RTTIME limit belong to a process, and the test process must keep its own. The suite runs
with CAP_SYS_NICE (as root), as it does for its throwaway PostgreSQL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from fastlane.errors import ConfigurationError
from fastlane.worker import Worker
from fastlane.worker._realtime import request_realtime

PRELUDE = """
import json, logging, os, resource, signal, sys, threading, time
from datetime import timedelta
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
from fastlane.worker._realtime import request_realtime

def policy(tid=0):
    return os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK

def fifo(tid=0):
    return policy(tid) == os.SCHED_FIFO
"""


def run_case(body: str, timeout: float = 30) -> tuple[dict[str, object], str]:
    """Run PRELUDE + body in a new interpreter; body prints one JSON object last."""
    completed = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True,
                               text=True, timeout=timeout, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1]), completed.stderr


def test_the_calling_thread_runs_fifo_and_threads_it_starts_run_normally() -> None:
    found, _ = run_case("""
        granted = request_realtime(7)
        seen = {}
        child = threading.Thread(target=lambda: seen.update(child=policy(), nice=os.getpriority(os.PRIO_PROCESS, 0)))
        child.start(); child.join()
        soft, _ = resource.getrlimit(resource.RLIMIT_RTTIME)
        print(json.dumps({"granted": granted, "main": policy(), "priority": os.sched_getparam(0).sched_priority,
                          "child": seen["child"], "rttime": soft,
                          "guarded": signal.getsignal(signal.SIGXCPU) not in (signal.SIG_DFL, None)}))
    """)
    assert found["granted"] is True
    assert (found["main"], found["priority"]) == (1, 7)  # SCHED_FIFO is 1
    assert found["child"] == 0  # SCHED_OTHER: reset on fork reaches threads too
    assert found["rttime"] == 250_000  # microseconds: RUNAWAY_LIMIT
    assert found["guarded"] is True


def test_a_thread_that_runs_past_the_limit_without_pausing_is_lowered_for_good() -> None:
    found, log = run_case("""
        lowered = []
        granted = request_realtime(1, runaway_limit=timedelta(milliseconds=50), on_lowered=lambda: lowered.append(1))
        deadline = time.monotonic() + 10
        while fifo() and time.monotonic() < deadline:
            pass  # computing without a pause, as a runaway handler would
        still = fifo()
        time.sleep(0.05)  # a pause, then more work: it stays lowered
        print(json.dumps({"granted": granted, "still_fifo": still, "lowered": len(lowered), "policy": policy()}))
    """)
    assert found == {"granted": True, "still_fifo": False, "lowered": 1, "policy": 0}
    assert "ran 50 ms without pausing" in log and "normal scheduling until the worker restarts" in log


def test_without_the_privilege_the_thread_stays_normal_and_the_reason_is_logged() -> None:
    found, log = run_case("""
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        if os.geteuid() == 0:
            os.setuid(65534)  # nobody: no CAP_SYS_NICE left
        granted = request_realtime(1)
        print(json.dumps({"granted": granted, "policy": policy()}))
    """)
    assert found == {"granted": False, "policy": 0}
    assert "needs CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 or more" in log


def test_a_loop_off_the_main_thread_is_not_raised_since_its_guard_could_not_run() -> None:
    found, log = run_case("""
        seen = {}
        def elsewhere():
            seen["granted"] = request_realtime(1)
            seen["policy"] = policy()
        thread = threading.Thread(target=elsewhere); thread.start(); thread.join()
        print(json.dumps({**seen, "main": policy()}))
    """)
    assert found == {"granted": False, "policy": 0, "main": 0}
    assert "needs the event loop on the main thread" in log


@pytest.mark.parametrize("priority", [0, 100, -1])
def test_a_priority_outside_1_to_99_is_refused(priority: int) -> None:
    with pytest.raises(ValueError, match="from 1 to 99"):
        request_realtime(priority)


@pytest.mark.parametrize("priority", [0, 100, True, 1.5, "1"])
def test_a_worker_refuses_a_priority_outside_1_to_99(priority: object) -> None:
    with pytest.raises(ConfigurationError, match="realtime_priority"):
        Worker(realtime_priority=priority)  # type: ignore[arg-type]
    worker = Worker()
    with pytest.raises(ConfigurationError, match="realtime_priority"):
        worker.override(realtime_priority=priority)  # type: ignore[arg-type]
