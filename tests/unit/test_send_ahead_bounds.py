"""The bounds of sending ahead: what a worker's clock probe may carry, and the --send-ahead lead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import workers_pb2 as pb
from fastlane.cli.main import main
from fastlane.domain.limits import MAX_SEND_AHEAD, MAX_WORKER_CLOCK_OFFSET, MAX_WORKER_CLOCK_UNCERTAINTY
from fastlane.errors import ConfigurationError, InvalidArgument
from fastlane.rpc import wire
from fastlane.server.servicers.workers import clock_probe_of
from fastlane.server.settings import Settings

MICROSECOND = timedelta(microseconds=1)


def test_a_probe_at_its_bounds_is_taken_as_sent() -> None:
    sent_at = Timestamp(seconds=int(datetime(2027, 1, 1, tzinfo=UTC).timestamp()), nanos=250_000_001)
    for uncertainty, offset in ((timedelta(0), MAX_WORKER_CLOCK_OFFSET),
                                (MAX_WORKER_CLOCK_UNCERTAINTY, -MAX_WORKER_CLOCK_OFFSET)):
        probe = clock_probe_of(pb.ClockProbe(probe_id=2**64 - 1, sent_at=sent_at,
                                             uncertainty=wire.duration(uncertainty), offset=wire.duration(offset)))
        assert (probe.probe_id, probe.sent_at_ns, probe.uncertainty, probe.offset) == (
            2**64 - 1, sent_at.ToNanoseconds(), uncertainty, offset)


def test_a_probe_without_an_estimate_has_none() -> None:
    probe = clock_probe_of(pb.ClockProbe(probe_id=0))
    assert (probe.sent_at_ns, probe.uncertainty, probe.offset) == (None, None, None)


@pytest.mark.parametrize(
    ("probe", "field"),
    [
        (pb.ClockProbe(uncertainty=wire.duration(MAX_WORKER_CLOCK_UNCERTAINTY + MICROSECOND)), "clock_probe.uncertainty"),
        (pb.ClockProbe(uncertainty=wire.duration(-MICROSECOND)), "clock_probe.uncertainty"),
        (pb.ClockProbe(uncertainty=Duration(seconds=2**62)), "clock_probe.uncertainty"),
        (pb.ClockProbe(offset=wire.duration(MAX_WORKER_CLOCK_OFFSET + MICROSECOND)), "clock_probe.offset"),
        (pb.ClockProbe(offset=wire.duration(-MAX_WORKER_CLOCK_OFFSET - MICROSECOND)), "clock_probe.offset"),
        (pb.ClockProbe(offset=Duration(seconds=-1, nanos=1)), "clock_probe.offset"),
        (pb.ClockProbe(offset=Duration(nanos=1_000_000_000)), "clock_probe.offset"),
        (pb.ClockProbe(sent_at=Timestamp(seconds=-1)), "clock_probe.sent_at"),
        (pb.ClockProbe(sent_at=Timestamp(seconds=0, nanos=-1)), "clock_probe.sent_at"),
        (pb.ClockProbe(sent_at=Timestamp(seconds=2**62)), "clock_probe.sent_at"),
    ],
)
def test_a_probe_out_of_bounds_is_refused_naming_the_field(probe: pb.ClockProbe, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        clock_probe_of(probe)
    assert refused.value.field == field


@pytest.mark.parametrize("lead", [timedelta(0), timedelta(milliseconds=20), MAX_SEND_AHEAD])
def test_the_send_ahead_lead_may_be_zero_up_to_its_bound(lead: timedelta) -> None:
    assert Settings(db_url="sqlite:///unused.db", send_ahead=lead).send_ahead == lead


@pytest.mark.parametrize("lead", [-MICROSECOND, MAX_SEND_AHEAD + MICROSECOND])
def test_a_send_ahead_lead_out_of_range_is_refused(lead: timedelta) -> None:
    with pytest.raises(ConfigurationError, match="--send-ahead"):
        Settings(db_url="sqlite:///unused.db", send_ahead=lead)


def test_sending_ahead_is_on_by_default_for_20_ms() -> None:
    assert Settings(db_url="sqlite:///unused.db").send_ahead == timedelta(milliseconds=20)


@pytest.mark.parametrize("value", ["-1", "1001", "soon", "nan"])
def test_send_ahead_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    assert main(["serve", "--send-ahead", value]) == 2
    assert "--send-ahead" in capsys.readouterr().err


def test_serve_help_documents_send_ahead(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--send-ahead MS" in out and "default: 20, at most 1000" in out
