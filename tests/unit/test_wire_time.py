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


def test_progress_reads_back_as_reported_not_as_its_float32_on_the_wire() -> None:
    from dataclasses import replace

    from fastlane.domain.models import Delivery, Run, RunState
    from fastlane.rpc.wire import run_from_pb, run_to_pb

    at = datetime(2030, 1, 1, tzinfo=UTC)
    run = Run(run_id="r", job_id="j", tenant="t", job_type="x", shard_id=0, scheduled_for=at, available_at=at,
              state=RunState.RUNNING, attempts=1, payload=b"", priority=0, manual=False,
              delivery=Delivery.AT_LEAST_ONCE, lease_ttl=timedelta(seconds=30), created_at=at, updated_at=at)
    for progress in (0.0, 0.4, 0.333333, 1.0):
        message = run_to_pb(replace(run, progress=progress))
        assert message.progress != progress or progress in (0.0, 1.0)  # float32 on the wire
        assert run_from_pb(message).progress == progress
