"""The node's clock: its wall clock corrected to the database's, and a step of it taken back at
once (every time injected: a wall clock and a monotonic clock the test moves)."""

from __future__ import annotations

from datetime import timedelta

from fastlane.runtime.clock import STEP_BOUND_NS, CorrectedClock

MS = 1_000_000


class Clocks:
    def __init__(self) -> None:
        self.wall = 1_700_000_000 * 1_000_000_000
        self.monotonic = 5_000 * 1_000_000_000
        self.steps: list[int] = []

    def advance(self, ns: int) -> None:
        self.wall += ns
        self.monotonic += ns

    def clock(self) -> CorrectedClock:
        return CorrectedClock(wall_ns=lambda: self.wall, monotonic_ns=lambda: self.monotonic,
                              on_step=self.steps.append)


def test_the_corrected_clock_is_the_wall_clock_plus_the_measured_offset() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    assert clock.now_ns() == clocks.wall
    clock.measured(timedelta(milliseconds=-300), timedelta(microseconds=50))
    # The lowest offset the measurement allows: never ahead of the database, at most 0.1 ms behind.
    assert clock.now_ns() == clocks.wall - 300 * MS - 50_000
    assert clock.offset == timedelta(milliseconds=-300, microseconds=-50)


def test_an_offset_within_its_uncertainty_and_the_deadband_leaves_the_wall_clock_as_it_is() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clock.measured(timedelta(microseconds=900), timedelta(microseconds=300))  # cannot be told from 0
    assert clock.now_ns() == clocks.wall
    clock.measured(timedelta(microseconds=-1_400), timedelta(microseconds=200))  # now it can: 1.4 > 0.2 + 1
    assert clock.now_ns() == clocks.wall - 1_600_000


def test_the_most_certain_recent_measurement_counts() -> None:
    clock = Clocks().clock()
    clock.measured(timedelta(milliseconds=-300), timedelta(microseconds=40))
    clock.measured(timedelta(milliseconds=-310), timedelta(milliseconds=5))  # a slow round trip
    assert clock.offset == timedelta(milliseconds=-300, microseconds=-40)
    for _ in range(8):  # the certain one ages out
        clock.measured(timedelta(milliseconds=-302), timedelta(microseconds=60))
    assert clock.offset == timedelta(milliseconds=-302, microseconds=-60)


def test_a_forward_step_is_taken_back_so_nothing_looks_due_early() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    before = clock.now_ns()
    clocks.advance(10 * MS)
    clocks.wall += 3_000 * MS  # the wall clock jumps 3 s ahead
    assert clock.now_ns() == before + 10 * MS  # corrected time went on as the monotonic clock did
    assert clocks.steps == [3_000 * MS] and clock.steps == 1
    clocks.advance(5 * MS)
    assert clock.now_ns() == before + 15 * MS


def test_a_backward_step_is_taken_back_so_nothing_looks_due_again() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    before = clock.now_ns()
    clocks.advance(1 * MS)
    clocks.wall -= 3_000 * MS
    assert clock.now_ns() == before + 1 * MS
    assert clocks.steps == [-3_000 * MS]


def test_a_step_moves_the_kept_measurements_with_it() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clock.measured(timedelta(0), timedelta(microseconds=40))
    clocks.wall += 2_000 * MS
    clock.now_ns()
    assert clock.offset == timedelta(milliseconds=-2_000)
    clock.measured(timedelta(milliseconds=-2_000), timedelta(milliseconds=3))  # the new, less certain one agrees
    assert clock.offset == timedelta(milliseconds=-2_000, microseconds=-40)  # the moved one still counts


def test_drift_within_the_bound_and_slew_over_a_long_wait_is_no_step() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clocks.advance(1 * MS)
    clocks.wall += STEP_BOUND_NS - 1
    clock.now_ns()
    clocks.advance(3_600 * 1_000 * MS)  # an hour asleep, slewed by 500 ppm meanwhile
    clocks.wall += 1_800 * MS
    clock.now_ns()
    assert clocks.steps == [] and clock.steps == 0


def test_the_wall_clock_as_it_is_stays_uncorrected() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clock.measured(timedelta(seconds=-5), timedelta(microseconds=10))
    assert clock.now() < clock.wall_now()
    assert (clock.wall_now() - clock.now()) == timedelta(seconds=5, microseconds=10)


def test_a_reading_the_thread_was_preempted_in_is_no_step() -> None:
    clocks = Clocks()
    start_wall, start_monotonic = clocks.wall, clocks.monotonic
    # Set up at 0; read at 10 ms, but the thread is preempted for 30 ms right after the wall clock.
    monotonic = iter([start_monotonic, start_monotonic + 10 * MS, start_monotonic + 40 * MS])
    wall = iter([start_wall, start_wall + 10 * MS])
    clock = CorrectedClock(wall_ns=lambda: next(wall), monotonic_ns=lambda: next(monotonic),
                           on_step=clocks.steps.append)
    assert clock.now_ns() == start_wall + 10 * MS
    assert clocks.steps == []
