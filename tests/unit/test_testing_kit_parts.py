"""The test kit's parts that need no server: ManualClock, the exported names, the process helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

import fastlane.testing
from fastlane.runtime.clock import Clock
from fastlane.testing import ManualClock, WaitTimedOut, free_port
from fastlane.testing.processes import FASTLANE_ROOT, ROOT, child_environment

T = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def test_a_manual_clock_moves_only_when_told():
    clock = ManualClock(T)
    assert clock.now() == clock.now() == T

    assert clock.advance(timedelta(minutes=5)) == T + timedelta(minutes=5)
    assert clock.advance(1.5) == T + timedelta(minutes=5, seconds=1.5)  # seconds
    assert clock.advance(-90) == T + timedelta(minutes=3, seconds=31.5)  # a clock stepped back
    clock.set(T - timedelta(days=1))
    assert clock.now() == T - timedelta(days=1)


def test_a_manual_clock_keeps_utc_and_refuses_naive_instants():
    clock = ManualClock(datetime(2031, 5, 6, 9, 8, 9, tzinfo=timezone(timedelta(hours=2))))
    assert clock.now() == T and clock.now().tzinfo is UTC
    with pytest.raises(ValueError, match="naive"):
        clock.set(datetime(2031, 1, 1))
    with pytest.raises(ValueError, match="naive"):
        ManualClock(datetime(2031, 1, 1))
    assert ManualClock().now().tzinfo is UTC


def test_a_manual_clock_is_a_clock():
    def read(clock: Clock) -> datetime:
        return clock.now()

    assert read(ManualClock(T)) == T


def test_the_kit_exports_what_its_all_names_and_nothing_from_protobuf():
    exported = {name: getattr(fastlane.testing, name) for name in fastlane.testing.__all__}
    assert sorted(exported) == sorted(fastlane.testing.__all__)
    assert {"FakeNode", "RunResult", "RunHandle", "ManualClock", "until", "ThrowawayPostgres"} <= exported.keys()
    assert not [name for name, value in exported.items() if "_pb2" in getattr(value, "__module__", "")]


def test_a_timed_out_wait_is_a_timeout_and_a_failed_expectation():
    assert issubclass(WaitTimedOut, TimeoutError) and issubclass(WaitTimedOut, AssertionError)


def test_children_import_this_fastlane_with_extra_paths_first(tmp_path):
    env = child_environment(tmp_path, FASTLANE_EXAMPLE="1")
    paths = env["PYTHONPATH"].split(":")
    assert paths[:2] == [str(tmp_path), str(FASTLANE_ROOT)]
    assert (env["PYTHONUNBUFFERED"], env["FASTLANE_EXAMPLE"]) == ("1", "1")
    assert ROOT == FASTLANE_ROOT and (ROOT / "fastlane" / "testing" / "__init__.py").exists()
    assert 1024 <= free_port() <= 65535

