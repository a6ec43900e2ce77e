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


def test_the_calling_thread_runs_fifo_threads_it_starts_run_normally_and_release_puts_all_back() -> None:
    found, _ = run_case("""
        grant = request_realtime(7)
        seen = {}
        child = threading.Thread(target=lambda: seen.update(child=policy()))
        child.start(); child.join()
        during = {"main": policy(), "priority": os.sched_getparam(0).sched_priority, "child": seen["child"],
                  "rttime": resource.getrlimit(resource.RLIMIT_RTTIME)[0],
                  "guarded": signal.getsignal(signal.SIGXCPU) == grant._runaway}
        grant.release()
        after = {"main": policy(), "handler_default": signal.getsignal(signal.SIGXCPU) is signal.SIG_DFL,
                 "rttime": resource.getrlimit(resource.RLIMIT_RTTIME)[0], "again": request_realtime(1) is not None}
        print(json.dumps({"during": during, "after": after}))
    """)
    assert found["during"] == {"main": 1, "priority": 7, "child": 0,  # SCHED_FIFO is 1, SCHED_OTHER 0: reset
                               "rttime": 250_000, "guarded": True}  # on fork reaches threads; RUNAWAY_LIMIT in µs
    assert found["after"] == {"main": 0, "handler_default": True, "rttime": -1,  # RLIM_INFINITY
                              "again": True}


@pytest.mark.parametrize("privilege_kept", [True, False])
def test_a_thread_that_runs_past_the_limit_without_blocking_is_lowered_until_released(privilege_kept: bool) -> None:
    # A worker raised through `ulimit -r` has no CAP_SYS_NICE, and then the kernel refuses to clear
    # the reset-on-fork flag: the guard must lower the thread without clearing it. Raising the
    # limit takes CAP_SYS_RESOURCE, so the case is made by giving up every capability (becoming
    # nobody) once the thread is raised.
    drop = "" if privilege_kept else "os.setuid(65534)"
    found, log = run_case(f"""
        lowered = []
        grant = request_realtime(1, runaway_limit=timedelta(milliseconds=50), on_lowered=lambda: lowered.append(1))
        {drop}
        deadline = time.monotonic() + 10
        while fifo() and time.monotonic() < deadline:
            pass  # computing without blocking, as a runaway handler would
        still = fifo()
        time.sleep(0.05)  # blocking, then more work: it stays lowered
        print(json.dumps({{"granted": grant is not None, "still_fifo": still, "lowered": len(lowered),
                          "policy": policy(), "recorded": grant.lowered}}))
    """)
    assert found == {"granted": True, "still_fifo": False, "lowered": 1, "policy": 0, "recorded": True}
    assert "ran 50 ms without blocking" in log and "normal scheduling until the worker stops" in log


def test_without_the_privilege_the_thread_stays_normal_and_the_reason_is_logged() -> None:
    found, log = run_case("""
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        if os.geteuid() == 0:
            os.setuid(65534)  # nobody: no CAP_SYS_NICE left
        grant = request_realtime(1)
        print(json.dumps({"granted": grant is not None, "policy": policy(),
                          "handler_default": signal.getsignal(signal.SIGXCPU) is signal.SIG_DFL}))
    """)
    assert found == {"granted": False, "policy": 0, "handler_default": True}
    assert "needs CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 or more" in log


def grant_in_a_thread(call: str) -> str:
    return f"seen = {{}}; t = threading.Thread(target=lambda: seen.update(g={call})); t.start(); t.join(); grant = seen['g']"


@pytest.mark.parametrize(("prepare", "call", "reason"), [
    ("", grant_in_a_thread("request_realtime(1)"), "needs the event loop on the main thread"),
    ("signal.signal(signal.SIGXCPU, lambda signum, frame: None)", "grant = request_realtime(1)",
     "SIGXCPU, which its runaway guard needs, has a handler already"),
    ("first = request_realtime(2)", "grant = request_realtime(1)", "another worker of this process holds it"),
    ("resource.setrlimit(resource.RLIMIT_RTTIME, (100_000, 200_000))", "grant = request_realtime(1)",
     "would kill the worker before its runaway guard could act"),
])
def test_where_the_guard_cannot_work_the_thread_is_not_raised(prepare: str, call: str, reason: str) -> None:
    """``call`` sets ``grant``; in a thread, the policy looked at is the main thread's, unchanged too."""
    found, log = run_case(f"""
        {prepare or "pass"}
        before = (policy(), os.sched_getparam(0).sched_priority)
        {call}
        print(json.dumps({{"granted": grant is not None,
                          "changed": (policy(), os.sched_getparam(0).sched_priority) != before}}))
    """)
    assert found == {"granted": False, "changed": False}
    assert reason in log


def test_an_ignored_sigxcpu_is_taken_over_and_given_back() -> None:
    found, _ = run_case("""
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # as a parent process may leave it
        grant = request_realtime(1)
        raised = fifo()
        grant.release()
        print(json.dumps({"raised": raised, "ignored_again": signal.getsignal(signal.SIGXCPU) is signal.SIG_IGN}))
    """)
    assert found == {"raised": True, "ignored_again": True}


def test_a_worker_runs_its_loop_fifo_while_it_runs_and_normally_after() -> None:
    found, log = run_case("""
        import asyncio
        from fastlane.worker import Worker
        worker = Worker("127.0.0.1:9", realtime_priority=3, follow_cluster=False, drain_timeout=1)

        @worker.handler("t")
        async def handle(ctx): ...

        async def main():
            running = asyncio.create_task(worker.run())
            deadline = time.monotonic() + 10
            while not fifo() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            during = (policy(), os.sched_getparam(0).sched_priority)
            await worker.stop()
            await running
            return during

        during = asyncio.run(main())
        print(json.dumps({"during": during, "after": policy()}))
    """)
    assert found == {"during": [1, 3], "after": 0}
    assert "this thread runs at real-time priority 3" in log


@pytest.mark.parametrize("priority", [0, 100, -1, True, 1.5])
def test_a_priority_outside_1_to_99_is_refused(priority: int) -> None:
    with pytest.raises(ValueError, match="from 1 to 99"):
        request_realtime(priority)


@pytest.mark.parametrize("priority", [-1, 100, True, 1.5, "1"])
def test_a_worker_refuses_a_priority_outside_0_to_99(priority: object) -> None:
    with pytest.raises(ConfigurationError, match="realtime_priority"):
        Worker(realtime_priority=priority)  # type: ignore[arg-type]
    worker = Worker()
    with pytest.raises(ConfigurationError, match="realtime_priority"):
        worker.override(realtime_priority=priority)  # type: ignore[arg-type]


def test_a_worker_priority_of_0_turns_real_time_off() -> None:
    worker = Worker(realtime_priority=5)
    worker.override(realtime_priority=0)
    assert worker._realtime_priority is None
    worker.override(realtime_priority=None)  # leaves it as it is
    assert worker._realtime_priority is None
    worker.override(realtime_priority=2)
    worker.override()
    assert worker._realtime_priority == 2
