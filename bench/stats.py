"""The pure arithmetic of the benchmark: run records, lag percentiles, ratios and targets.

No I/O and no clock: everything here is a function of its arguments, so the unit tests pin it
down exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

# Quantiles as exact fractions: nearest rank, ceil(q * n), computed on integers so that p99.9 of
# 1,000 samples is the 999th and not, through float rounding, the 1,000th.
QUANTILES: tuple[tuple[str, int, int], ...] = (("p50", 50, 100), ("p95", 95, 100), ("p99", 99, 100),
                                              ("p999", 999, 1000))
LAG_KEYS: tuple[str, ...] = (*(name for name, _, _ in QUANTILES), "max")
LAG_LABELS: Mapping[str, str] = {"p50": "p50", "p95": "p95", "p99": "p99", "p999": "p99.9", "max": "max"}
# The lags of every result, each from the scheduled instant to: the handler's start, the worker's
# receipt, the node's release.
LAG_KINDS: tuple[str, ...] = ("start_lag_ms", "delivery_lag_ms", "release_lag_ms")


def percentiles(values: Iterable[float]) -> dict[str, float | None]:
    """p50, p95, p99, p99.9 (key ``p999``) and max of ``values``, by nearest rank.

    The nearest-rank p-th percentile of n sorted values is the ``ceil(p * n)``-th of them: always
    an observed value, never an interpolation. Values are rounded to microsecond precision in
    milliseconds (3 decimals). An empty input gives None for every key.
    """
    ordered = sorted(values)
    count = len(ordered)
    if not count:
        return dict.fromkeys(LAG_KEYS)
    summary: dict[str, float | None] = {}
    for name, numerator, denominator in QUANTILES:
        rank = max(1, -(-numerator * count // denominator))  # ceil without floats
        summary[name] = round(ordered[rank - 1], 3)
    summary["max"] = round(ordered[-1], 3)
    return summary


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One run as a worker (or the peer) saw it; instants in microseconds since the epoch.

    ``released_us`` is 0 when the node did not say when it released the run; ``started_us`` (the
    handler's entry) is 0 when the line does not say (a record from before that column).
    ``cpu_wait_us``: how long the worker's loop thread waited for a CPU since the run before
    started (``fastlane.bench.cpu_wait``); None when the line does not say.
    """

    run_id: str
    scheduled_us: int
    released_us: int
    received_us: int
    job_id: str = ""
    started_us: int = 0
    cpu_wait_us: int | None = None


CPU_WAIT_FIELD = "cpu_wait_us="


def parse_record(line: str) -> RunRecord | None:
    """A worker line: ``run_id scheduled released received [job_id [started [more...]]]``; None for
    a blank or torn line. Lines without ``started`` (older workers) parse with ``started_us`` 0.
    Of the further fields, ``cpu_wait_us=N`` is read (a garbled one as unknown); others (a busy
    worker's tenant) are not."""
    fields = line.split()
    if len(fields) < 4:
        return None
    try:
        scheduled, released, received = int(fields[1]), int(fields[2]), int(fields[3])
        started = int(fields[5]) if len(fields) > 5 else 0
    except ValueError:
        return None
    return RunRecord(run_id=fields[0], scheduled_us=scheduled, released_us=released, received_us=received,
                     job_id=fields[4] if len(fields) > 4 else "", started_us=started,
                     cpu_wait_us=_cpu_wait_of(fields[6:]))


def _cpu_wait_of(fields: Sequence[str]) -> int | None:
    """The ``cpu_wait_us=N`` among a line's further fields; None when absent or garbled (a
    diagnostic, which must not cost the run its record)."""
    for field in fields:
        if field.startswith(CPU_WAIT_FIELD):
            value = field.removeprefix(CPU_WAIT_FIELD)
            return int(value) if value.isdigit() else None
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliveries:
    """What the workers received: first receipt of each run, and how many came again."""

    first: list[RunRecord]
    duplicates: int

    @property
    def delivered(self) -> int:
        return len(self.first)

    def delivery_lags_ms(self) -> list[float]:
        return [(record.received_us - record.scheduled_us) / 1000 for record in self.first]

    def release_lags_ms(self) -> list[float]:
        return [(record.released_us - record.scheduled_us) / 1000 for record in self.first if record.released_us]

    def start_lags_ms(self) -> list[float]:
        """Handler entry − scheduled, for the runs whose record says when the handler started."""
        return [(record.started_us - record.scheduled_us) / 1000 for record in self.first if record.started_us]


LATE_START_MS = 1.0  # a start this late or later is looked into by late_starts_waiting_for_cpu


def late_starts_waiting_for_cpu(records: Iterable[RunRecord], late_ms: float = LATE_START_MS) -> dict[str, object]:
    """Of the runs whose handler started ``late_ms`` or more after their instant, how many had a
    worker loop thread that waited for a CPU, since the run before it started, at least half the
    run's own lateness: counted as late because other processes held the cores. Only runs whose record says both when
    the handler started and how long the thread waited count; an empty dict when none does (a
    peer, an older worker, not Linux). ``worker_cpu_wait_ms``: percentiles of those waits.

    The wait counted is the thread's since the run before started, so part of it may fall before
    this run's instant: an attribution, not a proof (docs/benchmarks.md, *What the figures mean*).
    """
    known = [(record.started_us - record.scheduled_us, record.cpu_wait_us) for record in records
             if record.started_us and record.cpu_wait_us is not None]
    if not known:
        return {}
    late = [(lateness, waited) for lateness, waited in known if lateness >= late_ms * 1000]
    return {
        "late_starts": len(late),
        "late_starts_waiting_for_cpu": sum(1 for lateness, waited in late if 2 * waited >= lateness),
        "worker_cpu_wait_ms": percentiles(waited / 1000 for _, waited in known),
    }


def deliveries(records: Iterable[RunRecord]) -> Deliveries:
    """Keep the earliest receipt of each run id; every further receipt is a duplicate."""
    first: dict[str, RunRecord] = {}
    duplicates = 0
    for record in records:
        seen = first.get(record.run_id)
        if seen is None:
            first[record.run_id] = record
            continue
        duplicates += 1
        if record.received_us < seen.received_us:
            first[record.run_id] = record
    return Deliveries(first=list(first.values()), duplicates=duplicates)


def histogram_quantiles(before: Mapping[str, float], after: Mapping[str, float], metric: str,
                        quantiles: Mapping[str, float]) -> dict[str, float | None]:
    """Quantiles in ms of what a Prometheus histogram observed between two scrapes.

    Each quantile is the upper bound of the bucket it falls in (what a histogram can say);
    ``None`` when the bucket is the open-ended last one or nothing was observed.
    """
    prefix = f'{metric}_bucket{{le="'
    bounds = sorted(
        (float(name[len(prefix):-2]), after[name] - before.get(name, 0.0))
        for name in after if name.startswith(prefix)
    )
    total = bounds[-1][1] if bounds else 0.0
    figures: dict[str, float | None] = {}
    for label, q in quantiles.items():
        if total <= 0:
            figures[label] = None
            continue
        bound = next((upper for upper, count in bounds if count >= q * total), math.inf)
        figures[label] = None if math.isinf(bound) else round(bound * 1000, 3)
    figures["samples"] = total
    return figures


def stall_causes(before: Mapping[str, float], after: Mapping[str, float], metric: str,
                 most: int = 5, label: str = "cause") -> dict[str, float]:
    """The values of a counter's one label (``cause``; ``site`` for the busy stalls' sites) with
    the most increments between two scrapes."""
    prefix = f'{metric}{{{label}="'
    grown = {name[len(prefix):-2]: after[name] - before.get(name, 0.0) for name in after if name.startswith(prefix)}
    return dict(sorted(((cause, n) for cause, n in grown.items() if n > 0), key=lambda item: -item[1])[:most])


def runs_per_second(count: int, seconds: float | None) -> float | None:
    """``count / seconds`` rounded to one decimal; None when the span is empty or unknown."""
    if seconds is None or seconds <= 0:
        return None
    return round(count / seconds, 1)


def delivery_span_s(records: Sequence[RunRecord]) -> float | None:
    """From the earliest scheduled instant to the last receipt: the time the deliveries took."""
    if not records:
        return None
    start = min(record.scheduled_us for record in records)
    end = max(record.received_us for record in records)
    return (end - start) / 1e6


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` to 4 significant digits; None if either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    value = numerator / denominator
    if value == 0:
        return 0.0
    digits = 3 - int(math.floor(math.log10(abs(value))))
    return round(value, max(digits, 0))


def lag_ratios(system: Mapping[str, object], peer: Mapping[str, object]) -> dict[str, dict[str, float | None]]:
    """``system : peer`` for every lag figure of both results (each of ``LAG_KINDS``).

    Below 1 the system is faster than the peer at that percentile. A lag one of them lacks (a
    result from before start lags were recorded) gives None throughout.
    """
    ratios: dict[str, dict[str, float | None]] = {}
    for kind in LAG_KINDS:
        ours = system.get(kind) or {}
        theirs = peer.get(kind) or {}
        assert isinstance(ours, Mapping) and isinstance(theirs, Mapping)
        ratios[kind] = {key: ratio(ours.get(key), theirs.get(key)) for key in LAG_KEYS}
    return ratios


class Status(StrEnum):
    MET = "MET"
    MISSED = "MISSED"
    NOT_APPLICABLE = "N/A"


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A goal stated as ``measured <op> limit``.

    ``applies`` is False when the run cannot speak to the target (wrong backend, nothing
    measured); ``note`` says why, or what was scaled down.
    """

    name: str
    limit: float
    op: str  # "<=" or ">="
    unit: str
    measured: float | None
    applies: bool = True
    note: str = ""

    @property
    def status(self) -> Status:
        if not self.applies or self.measured is None:
            return Status.NOT_APPLICABLE
        if self.op == "<=":
            return Status.MET if self.measured <= self.limit else Status.MISSED
        if self.op == ">=":
            return Status.MET if self.measured >= self.limit else Status.MISSED
        raise ValueError(f"target operator {self.op!r} is not one of '<=', '>='")

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "limit": self.limit, "op": self.op, "unit": self.unit,
                "measured": self.measured, "status": self.status.value, "note": self.note}


def lag_of(result: Mapping[str, object] | None, kind: str, key: str) -> float | None:
    """``result[kind][key]`` (say delivery_lag_ms, p99), or None when absent."""
    if not result:
        return None
    figures = result.get(kind)
    if not isinstance(figures, Mapping):
        return None
    value = figures.get(key)
    return float(value) if isinstance(value, int | float) else None


def scale_note(jobs: int, full: int) -> str:
    """A note for a target stated at ``full`` jobs but measured with ``jobs``."""
    return "" if jobs >= full else f"measured with {jobs:,} jobs; the target is stated for {full:,}"
