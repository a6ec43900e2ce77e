"""A queue's backlog limit: --max-backlog, or fewer runs by the pace its workers take them at."""

from __future__ import annotations

from fastlane.engine.backlog import MIN_BACKLOG, PACE_WINDOW, BacklogLimits

Q = ("report", "acme")


def _limits(totals: dict[tuple[str, str], int], *, max_backlog: int = 10_000, seconds: float = 2.0) -> BacklogLimits:
    return BacklogLimits(max_backlog=max_backlog, seconds=seconds, assigned_totals=lambda: dict(totals))


def test_a_queue_with_no_pace_yet_gets_the_floor():
    limits = _limits({Q: 5_000})
    assert limits.limit(Q) == MIN_BACKLOG
    limits.measure(0.0)  # one reading is not a pace
    assert limits.pace(Q) == 0.0 and limits.limit(Q) == MIN_BACKLOG


def test_the_limit_is_seconds_of_the_pace_between_the_floor_and_max_backlog():
    totals = {Q: 0}
    limits = _limits(totals, max_backlog=10_000, seconds=2.0)
    limits.measure(0.0)
    totals[Q] = 3_000  # 3,000 a second
    limits.measure(PACE_WINDOW)
    assert limits.pace(Q) == 3_000 / PACE_WINDOW
    assert limits.limit(Q) == 6_000
    totals[Q] += 9_000
    limits.measure(2 * PACE_WINDOW)
    assert limits.limit(Q) == 10_000  # 18,000 by the pace: max_backlog bounds it
    assert limits.limit(("report", "other")) == MIN_BACKLOG  # a queue never assigned to


def test_one_slow_window_does_not_drop_the_limit_but_two_do():
    totals = {Q: 0}
    limits = _limits(totals, seconds=2.0)
    for second, total in enumerate([0, 2_000, 4_000, 4_100, 4_200], start=0):
        totals[Q] = total
        limits.measure(second * PACE_WINDOW)
    # Windows: 2,000, 2,000, 100, 100 a second: the higher of the last two is 100.
    assert limits.pace(Q) == 100 and limits.limit(Q) == MIN_BACKLOG
    limits = _limits(totals, seconds=2.0)
    for second, total in enumerate([0, 2_000, 2_050]):
        totals[Q] = total
        limits.measure(second * PACE_WINDOW)
    assert limits.pace(Q) == 2_000  # the slow window is one of two: the faster one counts


def test_readings_closer_than_a_window_are_skipped():
    totals = {Q: 0}
    limits = _limits(totals)
    limits.measure(0.0)
    totals[Q] = 5_000
    limits.measure(PACE_WINDOW / 2)  # too soon: no reading, no pace
    assert limits.pace(Q) == 0.0
    limits.measure(PACE_WINDOW)
    assert limits.pace(Q) == 5_000 / PACE_WINDOW


def test_zero_seconds_leaves_max_backlog_alone():
    totals = {Q: 0}
    limits = _limits(totals, max_backlog=250, seconds=0.0)
    limits.measure(0.0)
    totals[Q] = 1
    limits.measure(PACE_WINDOW)
    assert limits.limit(Q) == 250 and limits.pace(Q) == 0.0
