"""The worker's estimate of a node's clock, from probe round trips: times injected, in nanoseconds."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import workers_pb2 as pb
from fastlane.worker import ClockEstimate
from fastlane.worker._clock import MAX_ROUND_TRIP_NS, ClockEstimator, ClockSample

MS = 1_000_000
T0 = 1_900_000_000 * 1_000_000_000  # some instant of the worker's clock


def stamp(ns: int) -> Timestamp:
    message = Timestamp()
    message.FromNanoseconds(ns)
    return message


def echo_of(probe: pb.ClockProbe, node_ns: int) -> pb.ClockEcho:
    return pb.ClockEcho(probe_id=probe.probe_id, probe_sent_at=probe.sent_at, node_time=stamp(node_ns))


def round_trip(clock: ClockEstimator, sent: int, rtt: int, node_ahead: int) -> ClockSample | None:
    """A probe sent at ``sent``, echoed by a node ``node_ahead`` ahead at the round trip's middle."""
    probe = clock.probe(sent)
    return clock.echo(echo_of(probe, sent + rtt // 2 + node_ahead), sent + rtt)


def test_no_estimate_before_the_first_echo_and_probes_say_so() -> None:
    clock = ClockEstimator()
    probe = clock.probe(T0)
    assert (clock.estimate, clock.offset_ns, clock.uncertainty_ns, clock.echoed) == (None, None, None, False)
    assert probe.sent_at.ToNanoseconds() == T0
    assert not probe.HasField("uncertainty") and not probe.HasField("offset")


def test_one_echo_gives_offset_from_the_round_trip_midpoint_and_half_the_round_trip_as_uncertainty() -> None:
    clock = ClockEstimator()
    probe = clock.probe(T0)
    sample = clock.echo(echo_of(probe, T0 + 250 * MS), T0 + 4 * MS)  # node 248 ms ahead, 4 ms round trip
    assert sample == ClockSample(offset_ns=248 * MS, round_trip_ns=4 * MS)
    assert (clock.offset_ns, clock.uncertainty_ns) == (248 * MS, 2 * MS)
    assert clock.estimate == ClockEstimate(0.248, 0.002)


def test_the_sample_with_the_shortest_round_trip_wins_and_probes_carry_it() -> None:
    clock = ClockEstimator()
    round_trip(clock, T0, 10 * MS, node_ahead=-30 * MS + 3 * MS)  # a slow trip, skewed
    round_trip(clock, T0 + 100 * MS, 1 * MS, node_ahead=-30 * MS)
    round_trip(clock, T0 + 200 * MS, 6 * MS, node_ahead=-30 * MS - 2 * MS)
    assert (clock.offset_ns, clock.uncertainty_ns) == (-30 * MS, MS // 2)
    probe = clock.probe(T0 + 300 * MS)
    assert probe.uncertainty.ToNanoseconds() == MS // 2
    assert probe.offset.ToNanoseconds() == -30 * MS


def test_only_the_recent_samples_are_kept() -> None:
    clock = ClockEstimator(keep=3)
    round_trip(clock, T0, 1 * MS, node_ahead=5 * MS)  # the best, until three newer push it out
    for index in range(1, 4):
        round_trip(clock, T0 + index * 100 * MS, 8 * MS, node_ahead=7 * MS)
    assert (clock.offset_ns, clock.uncertainty_ns) == (7 * MS, 4 * MS)


def test_on_a_tie_the_newest_sample_wins() -> None:
    clock = ClockEstimator()
    round_trip(clock, T0, 2 * MS, node_ahead=1 * MS)
    round_trip(clock, T0 + 100 * MS, 2 * MS, node_ahead=3 * MS)
    assert clock.offset_ns == 3 * MS


def test_unknown_repeated_or_absurd_echoes_are_ignored() -> None:
    clock = ClockEstimator()
    probe = clock.probe(T0)
    node = T0 + 1 * MS
    assert clock.echo(pb.ClockEcho(probe_id=probe.probe_id + 100, probe_sent_at=probe.sent_at,
                                   node_time=stamp(node)), T0 + 2 * MS) is None  # never sent
    assert clock.echo(pb.ClockEcho(probe_id=probe.probe_id, probe_sent_at=probe.sent_at), T0 + 2 * MS) is None
    assert not clock.echoed  # ...and the probe is used up by that echo without a node time

    late = clock.probe(T0)
    assert clock.echo(echo_of(late, node), T0 + MAX_ROUND_TRIP_NS + 1) is None  # too old to say anything
    backwards = clock.probe(T0)
    assert clock.echo(echo_of(backwards, node), T0 - 1) is None  # the worker's clock stepped back
    garbled = clock.probe(T0)
    wrong = pb.ClockEcho(probe_id=garbled.probe_id, probe_sent_at=stamp(T0 + 5), node_time=stamp(node))
    assert clock.echo(wrong, T0 + 2 * MS) is None  # not the probe's own send time
    assert clock.estimate is None

    good = clock.probe(T0)
    assert clock.echo(echo_of(good, node), T0 + 2 * MS) is not None
    assert clock.echo(echo_of(good, node), T0 + 2 * MS) is None  # the same echo twice counts once
    assert (clock.offset_ns, clock.uncertainty_ns) == (0, MS)


def test_probes_a_node_never_answers_are_forgotten() -> None:
    clock = ClockEstimator()
    first = clock.probe(T0)
    for index in range(1, 200):
        clock.probe(T0 + index * 10 * MS)
    assert clock.echo(echo_of(first, T0), T0 + MS) is None  # long dropped: at most 64 wait
    assert len(clock._pending) <= 64


def test_reset_forgets_samples_and_pending_probes() -> None:
    clock = ClockEstimator()
    pending = clock.probe(T0)
    round_trip(clock, T0, 2 * MS, node_ahead=9 * MS)
    clock.reset()
    assert clock.estimate is None
    assert clock.echo(echo_of(pending, T0), T0 + MS) is None


def test_a_step_of_the_workers_clock_moves_the_estimate_and_pending_probes_with_it() -> None:
    clock = ClockEstimator()
    round_trip(clock, T0, 1 * MS, node_ahead=10 * MS)
    round_trip(clock, T0 + 100 * MS, 3 * MS, node_ahead=10 * MS)
    pending = clock.probe(T0 + 200 * MS)
    clock.stepped(2_000 * MS)  # the worker's clock jumped 2 s ahead: the node is now 1.99 s behind it
    assert clock.offset_ns == 10 * MS - 2_000 * MS
    # The probe sent before the step is echoed after it: still a sample of the new offset.
    sample = clock.echo(echo_of(pending, T0 + 200 * MS + 10 * MS + 1 * MS), T0 + 2_200 * MS + 2 * MS)
    assert sample == ClockSample(offset_ns=10 * MS - 2_000 * MS, round_trip_ns=2 * MS)
    assert clock.offset_ns == 10 * MS - 2_000 * MS
