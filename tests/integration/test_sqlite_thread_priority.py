"""SQLite's connection threads run at a lower CPU priority than the event loop's thread, so the
loop's timers (and a worker's start of a held run on the same machine) win a contended core."""

from __future__ import annotations

import contextlib
import os
import sys
from datetime import timedelta

from fastlane.domain.models import JobSpec, Schedule
from fastlane.storage import open_store
from fastlane.storage.sqlite.connection import CONNECTION_THREAD_NICENESS

# Only Linux sets a single thread's priority (setpriority on a thread id); elsewhere the store
# leaves every thread as it was, and this test checks that instead.
LOWERS_THREADS = sys.platform == "linux"


def niceness_of_threads() -> dict[int, int]:
    """Each thread's niceness, by native id (Linux lists them in /proc; elsewhere only the caller's)."""
    if not LOWERS_THREADS:
        return {0: os.getpriority(os.PRIO_PROCESS, 0)}
    niceness = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread (an earlier test's) that ended meanwhile
            niceness[int(tid)] = os.getpriority(os.PRIO_PROCESS, int(tid))
    return niceness


async def test_the_connection_threads_run_lower_than_the_loop_and_the_store_still_works(tmp_path):
    before = niceness_of_threads()
    loop_niceness = os.getpriority(os.PRIO_PROCESS, 0)
    expected = min(loop_niceness + CONNECTION_THREAD_NICENESS, 19)  # 19 is the lowest there is
    store = open_store(f"sqlite:///{tmp_path}/threads.db", shard_count=4)
    try:
        await store.migrate()  # opens the writer
        job, _ = await store.jobs.create_job(JobSpec(name="j", job_type="t", schedule=Schedule.interval(timedelta(hours=1))))
        assert (await store.jobs.get_job("default", job.job_id)).name == "j"  # and the reader
        started = {tid: nice for tid, nice in niceness_of_threads().items() if tid not in before}
        lowered = [tid for tid, nice in started.items() if nice == expected]
        if LOWERS_THREADS:
            assert len(lowered) >= 2, f"threads started by the store and their niceness: {started}"
        assert os.getpriority(os.PRIO_PROCESS, 0) == loop_niceness  # the caller's thread is untouched
    finally:
        await store.close()
