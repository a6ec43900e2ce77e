"""What the fast lane is tuned by, with its defaults: the one place they are written.

The node's :class:`~fastlane.server.settings.Settings` carries the same fields under the same
names (the CLI's flags set them and their bounds are checked there) and hands the lane
``settings.lane``; the lane's stages (window, write ahead, release) read only this.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from fastlane.engine.dispatch.reserve import PriorityReserve


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneSettings:
    # How far ahead of now the lane holds due jobs and runs in memory (its window).
    window: timedelta = timedelta(seconds=10)
    # How early runs are at least written before they are due (earlier when many are due together).
    lead: timedelta = timedelta(milliseconds=250)
    # How often the lane reads the jobs entering the window.
    scan_interval: timedelta = timedelta(seconds=1)
    # How often the lane rereads the whole window and the runs nobody holds: the safety net for
    # changes made through another node (and any missed notification).
    full_scan_interval: timedelta = timedelta(seconds=30)
    # The most occurrences written in one materialisation transaction, and the most runs released
    # in one pass.
    max_batch: int = 2_000
    # Released runs of one job type and tenant waiting for a free worker credit or their tenant's
    # cap (it gets less than is due) beyond which no new runs of it are written: its due jobs
    # wait in the window, and their misfire policy decides what runs once the backlog has shrunk.
    # Writing on would only lengthen every run's wait and take the node's time from sending.
    max_backlog: int = 10_000
    # Seconds' worth of the runs a job type and tenant has lately sent to workers (at least 1,000
    # runs, or max_backlog if that is less) beyond which its due jobs are held as by max_backlog:
    # a flood stops being written within a second instead of filling max_backlog at its own rate.
    # Zero: max_backlog alone.
    max_backlog_seconds: float = 2.0
    # How long before its instant a run may be sent to a worker whose clock is known to within
    # this; the worker holds it and starts it on the instant. Zero: every run is sent on its instant.
    send_ahead: timedelta = timedelta(milliseconds=20)
    # Credits of every worker stream kept for urgent runs; None: any run takes any credit.
    priority_reserve: PriorityReserve | None = None


LANE_DEFAULTS = LaneSettings()
