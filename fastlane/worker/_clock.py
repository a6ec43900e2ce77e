"""How far one node's clock is from this worker's, estimated from probe round trips.

A node may send a run ahead of its time with the instant to start it (``Assignment.start_at``, on
the node's clock). To start it on that instant the worker must know the node's clock: it sends
probes (``ClockProbe``, stamped with its own clock at ``t0``), the node echoes each at once with
its clock (``tn``), and the echo arrives at ``t3``. Assuming the node read its clock halfway
through the round trip,

    offset = tn - (t0 + t3) / 2        (node minus worker)
    uncertainty = (t3 - t0) / 2        (the offset is right to within this)

The shorter the round trip, the tighter the bound: :class:`ClockEstimator` keeps the recent
samples and uses the one with the shortest round trip. It is pure — every time is passed in as
nanoseconds of the worker's wall clock (``time.time_ns()``), so the tests inject them. Integers of
nanoseconds rather than ``timedelta`` here: the sums are exact, and they meet ``time.time_ns`` and
protobuf's nanoseconds without conversion.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from fastlane._proto import workers_pb2 as pb

SAMPLES_KEPT = 16
# An echo later than this answers a probe too old to say anything precise (or the clock jumped).
MAX_ROUND_TRIP_NS = 5_000_000_000
_MAX_PENDING = 64  # probes awaiting their echo; a node that never echoes must not grow this


class ClockEstimate(NamedTuple):
    """A node's clock relative to this worker's, in seconds.

    Attributes:
        offset_s: Node clock minus worker clock.
        uncertainty_s: The offset is right to within this (half the best sample's round trip).
    """

    offset_s: float
    uncertainty_s: float


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One probe's round trip; nanoseconds."""

    offset_ns: int
    round_trip_ns: int


class ClockEstimator:
    """The offset of one node's clock from this worker's, from the best of the recent samples.

    Args:
        keep: How many recent samples to choose the best from.
    """

    def __init__(self, *, keep: int = SAMPLES_KEPT) -> None:
        self._samples: deque[ClockSample] = deque(maxlen=keep)
        # probe id: (sent at as stamped on the probe, sent at on the clock as it is now), worker ns
        self._pending: dict[int, tuple[int, int]] = {}
        self._next_id = 1
        self._best: ClockSample | None = None

    @property
    def best(self) -> ClockSample | None:
        """The sample the estimate comes from; None before the first echo."""
        return self._best

    @property
    def offset_ns(self) -> int | None:
        """Node clock minus worker clock; None before the first echo."""
        return self._best.offset_ns if self._best is not None else None

    @property
    def uncertainty_ns(self) -> int | None:
        """Half the best sample's round trip; None before the first echo."""
        return self._best.round_trip_ns // 2 if self._best is not None else None

    @property
    def estimate(self) -> ClockEstimate | None:
        """The estimate in seconds, for the public API; None before the first echo."""
        if self._best is None:
            return None
        return ClockEstimate(self._best.offset_ns / 1e9, self._best.round_trip_ns / 2e9)

    @property
    def echoed(self) -> bool:
        """Whether any echo was accepted since the last :meth:`reset`."""
        return self._best is not None

    def reset(self) -> None:
        """Forget every sample and probe: a new connection may reach another node (a restart)."""
        self._samples.clear()
        self._pending.clear()
        self._best = None

    def stepped(self, jump_ns: int) -> None:
        """This worker's wall clock jumped by ``jump_ns`` (against its monotonic clock): every
        sample and pending probe moves with it, so the estimate stays right instead of waiting
        for fresh samples to outvote the old ones."""
        self._samples = deque((ClockSample(s.offset_ns - jump_ns, s.round_trip_ns) for s in self._samples),
                              maxlen=self._samples.maxlen)
        self._pending = {probe_id: (stamped, sent + jump_ns) for probe_id, (stamped, sent) in self._pending.items()}
        if self._best is not None:
            self._best = ClockSample(self._best.offset_ns - jump_ns, self._best.round_trip_ns)

    def probe(self, now_ns: int) -> pb.ClockProbe:
        """A probe sent at ``now_ns``, carrying the current estimate (the node decides by it)."""
        for probe_id in [i for i, (_, sent) in self._pending.items() if now_ns - sent > MAX_ROUND_TRIP_NS]:
            del self._pending[probe_id]
        while len(self._pending) >= _MAX_PENDING:
            del self._pending[next(iter(self._pending))]  # the oldest: dicts keep insertion order
        probe_id, self._next_id = self._next_id, self._next_id + 1
        self._pending[probe_id] = (now_ns, now_ns)
        message = pb.ClockProbe(probe_id=probe_id, sent_at=_timestamp(now_ns))
        if self._best is not None:
            message.uncertainty.CopyFrom(_duration(self._best.round_trip_ns // 2))
            message.offset.CopyFrom(_duration(self._best.offset_ns))
        return message

    def echo(self, echo: pb.ClockEcho, received_ns: int) -> ClockSample | None:
        """Take the node's echo, received at ``received_ns``; the sample, or None if ignored.

        Ignored: an echo of a probe this estimator did not send (or already took), one that does
        not echo the probe's own send time, one without the node's time, and one whose round trip
        is negative (the worker's clock stepped back) or longer than ``MAX_ROUND_TRIP_NS``.
        """
        pending = self._pending.pop(echo.probe_id, None)
        if pending is None or not echo.HasField("node_time"):
            return None
        stamped_ns, sent_ns = pending
        if echo.HasField("probe_sent_at") and echo.probe_sent_at.ToNanoseconds() != stamped_ns:
            return None
        round_trip = received_ns - sent_ns
        if not 0 <= round_trip <= MAX_ROUND_TRIP_NS:
            return None
        return self.add(ClockSample(offset_ns=echo.node_time.ToNanoseconds() - (sent_ns + received_ns) // 2,
                                    round_trip_ns=round_trip))

    def add(self, sample: ClockSample) -> ClockSample:
        """Keep ``sample`` and choose the best of those kept: the shortest round trip, the newest
        on a tie (the clocks may have drifted since an older one)."""
        self._samples.append(sample)
        self._best = min(reversed(self._samples), key=lambda kept: kept.round_trip_ns)
        return sample


def _timestamp(ns: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(ns)
    return stamp


def _duration(ns: int) -> Duration:
    duration = Duration()
    duration.FromNanoseconds(ns)
    return duration
