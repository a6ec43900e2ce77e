"""Timestamps and durations on the wire: the arithmetic conversions agree with protobuf's helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane.rpc import wire


@pytest.mark.parametrize("instant", [
    datetime(2027, 3, 1, 9, 30, 0, 123456, tzinfo=UTC),
    datetime(1960, 1, 1, 0, 0, 0, 1, tzinfo=UTC),  # before the epoch
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2027, 3, 28, 2, 30, tzinfo=UTC) + timedelta(hours=-1),
])
def test_timestamps_round_trip_as_protobuf_converts_them(instant):
    expected = Timestamp()
    expected.FromDatetime(instant)
    assert wire.timestamp(instant) == expected
    assert wire.instant(expected) == instant and wire.epoch_plus(expected) == instant


@pytest.mark.parametrize("delta", [
    timedelta(seconds=30), timedelta(milliseconds=1500), timedelta(seconds=-1.5), timedelta(0),
    timedelta(days=3, microseconds=7),
])
def test_durations_match_protobuf(delta):
    expected = Duration()
    expected.FromTimedelta(delta)
    assert wire.duration(delta) == expected


def test_absent_values_stay_absent():
    assert wire.timestamp(None) is None and wire.duration(None) is None
    assert wire.instant(Timestamp(), present=False) is None
