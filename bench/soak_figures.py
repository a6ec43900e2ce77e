"""What ``fastlane bench soak`` makes of its samples and the workers' records: pure functions.

A soak is cut into slices of equal length. Each slice gets the largest figure of every resource
sampled in it outside the fault windows (a resource that grows shows it in its maxima; a socket
or connection held only while a worker or the database is being replaced is a fault's, not
growth, and is reported apart), and the start lags of the runs *due* in it, from the workers'
records. Growth is judged from the second slice on: the first is the warm-up, in which the node
trims the seeded history and its allocator and caches fill for the first time. Occurrences are checked one by one: every instant a periodic job had before
the load stopped, and every one-shot job created, must have been run, and by one run only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fastlane.bench.stats import parse_record, percentiles

GROWTH_AT_MOST = 1.05  # a resource's maximum in a later slice, over its maximum in the first after the warm-up
DRIFT_AT_MOST = 1.10  # the last slice's start-lag p99 (outside fault windows), over the first's
RESOURCES = ("rss_bytes", "open_files", "threads", "db_connections")


@dataclass(frozen=True, slots=True)
class Slicing:
    """``count`` slices of ``seconds`` each from ``start_us`` (microseconds since the epoch)."""

    start_us: int
    seconds: float
    count: int

    def index(self, instant_us: int) -> int | None:
        """The slice an instant falls in, None before the first or after the last."""
        if not self.start_us <= instant_us < self.end_us:
            return None
        return min(int((instant_us - self.start_us) // (self.seconds * 1_000_000)), self.count - 1)

    @property
    def end_us(self) -> int:
        return self.start_us + round(self.count * self.seconds * 1_000_000)


def slicing_for(start_us: int, duration_s: float, *, full_slice_s: float = 300.0, minimum_s: float = 20.0) -> Slicing:
    """Five-minute slices for a long soak; a short one is cut into six (of at least ``minimum_s``).
    The soak lasts the whole slices nearest its duration: 1.1 h is thirteen slices, 65 minutes."""
    seconds = full_slice_s if duration_s >= 6 * full_slice_s else max(minimum_s, duration_s / 6)
    return Slicing(start_us=start_us, seconds=seconds, count=max(1, round(duration_s / seconds)))


@dataclass(slots=True)
class ResourceSamples:
    """Every resource sample of the soak, kept so the fault windows (known only as each fault
    ends) can be told apart from the steady samples once the soak is over."""

    slicing: Slicing
    samples: list[tuple[int, dict[str, int]]] = field(default_factory=list)

    def add(self, instant_us: int, sample: Mapping[str, int | None]) -> None:
        if self.slicing.index(instant_us) is not None:
            self.samples.append((instant_us, {name: value for name, value in sample.items() if value is not None}))

    def maxima(self, faults: Sequence[FaultWindow] = (), *, in_faults: bool = False) -> list[dict[str, int]]:
        """The largest value of each resource in each slice: of the samples outside every fault
        window, or (``in_faults``) of all of them."""
        kept: list[dict[str, int]] = [{} for _ in range(self.slicing.count)]
        for instant_us, sample in self.samples:
            if not in_faults and any(fault.covers(instant_us) for fault in faults):
                continue
            index = self.slicing.index(instant_us)
            assert index is not None  # add() kept only samples within a slice
            for name, value in sample.items():
                kept[index][name] = max(kept[index].get(name, value), value)
        return kept


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """From a fault's start to ``settle_s`` after it ended: runs due in it are late by the fault."""

    kind: str
    start_us: int
    end_us: int

    def covers(self, instant_us: int) -> bool:
        return self.start_us <= instant_us < self.end_us


@dataclass(slots=True)
class Occurrences:
    """What the no-op worker ran, read from its records: per job, the instants run and by which runs."""

    runs_by_occurrence: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    started_again: int = 0  # a run whose handler was entered more than once (after a worker was killed)
    start_lags_by_slice: list[list[float]] = field(default_factory=list)
    steady_lags_by_slice: list[list[float]] = field(default_factory=list)  # the same, outside fault windows


def read_occurrences(lines: Iterable[str], slicing: Slicing, faults: Sequence[FaultWindow]) -> Occurrences:
    """The records of the no-op worker (``bench/lag_worker.py``), every run's first start counted."""
    found = Occurrences(start_lags_by_slice=[[] for _ in range(slicing.count)],
                        steady_lags_by_slice=[[] for _ in range(slicing.count)])
    seen: set[str] = set()
    for line in lines:
        record = parse_record(line)
        if record is None:
            continue
        if record.run_id in seen:
            found.started_again += 1
            continue
        seen.add(record.run_id)
        found.runs_by_occurrence.setdefault((record.job_id, record.scheduled_us), set()).add(record.run_id)
        index = slicing.index(record.scheduled_us)
        if index is None or not record.started_us:
            continue
        lag_ms = (record.started_us - record.scheduled_us) / 1000
        found.start_lags_by_slice[index].append(lag_ms)
        if not any(fault.covers(record.scheduled_us) for fault in faults):
            found.steady_lags_by_slice[index].append(lag_ms)
    return found


def periodic_instants(phase_us: int, period_us: int, start_us: int, end_us: int) -> range:
    """The instants ``phase + k x period`` in ``[start_us, end_us)``."""
    first_k = -(-(start_us - phase_us) // period_us)  # ceiling division
    first = phase_us + first_k * period_us
    return range(first, end_us, period_us)


@dataclass(frozen=True, slots=True)
class Accounting:
    expected: int
    lost: int  # expected and never run
    twice: int  # an occurrence run by two or more runs
    examples: tuple[str, ...] = ()  # a few lost occurrences, to look up


def account(expected: Mapping[str, Iterable[int]], found: Occurrences) -> Accounting:
    """Each job's expected instants against the runs recorded for them."""
    total = lost = 0
    examples: list[str] = []
    for job_id, instants in expected.items():
        for instant in instants:
            total += 1
            if (job_id, instant) not in found.runs_by_occurrence:
                lost += 1
                if len(examples) < 5:
                    examples.append(f"{job_id}@{instant}")
    twice = sum(1 for runs in found.runs_by_occurrence.values() if len(runs) > 1)
    return Accounting(expected=total, lost=lost, twice=twice, examples=tuple(examples))


def workflow_steps(lines: Iterable[str]) -> tuple[set[tuple[str, str]], int]:
    """From the workflow worker's records (``bench/workflow_worker.py``): the (workflow run, step)
    pairs that ended, and how many steps were run by a second run (a run whose handler is entered
    again, after its lease expired, is one run retried: not counted)."""
    ended: set[tuple[str, str]] = set()
    runs: dict[tuple[str, str], str] = {}
    twice = 0
    for line in lines:
        fields = line.split()
        if len(fields) != 5:
            continue
        kind, run_id, workflow_run_id, step, _at = fields
        key = (workflow_run_id, step)
        if kind == "S":
            twice += runs.setdefault(key, run_id) != run_id
        elif kind == "E":
            ended.add(key)
    return ended, twice


def slice_rows(slicing: Slicing, resources: ResourceSamples, faults: Sequence[FaultWindow], found: Occurrences,
               loop_lag: Sequence[Mapping[str, float | None]], trimmed: Sequence[float]) -> list[dict[str, object]]:
    """One row per slice: resources (outside fault windows, and the most held during them), loop
    lag, start lag (all runs due, and outside fault windows)."""
    outside_faults, including_faults = resources.maxima(faults), resources.maxima(faults, in_faults=True)
    rows = []
    for index in range(slicing.count):
        everything = percentiles(found.start_lags_by_slice[index])
        steady = percentiles(found.steady_lags_by_slice[index])
        lag = loop_lag[index] if index < len(loop_lag) else {}
        rows.append({
            "slice": index + 1,
            "from_s": round(index * slicing.seconds),
            **{name: outside_faults[index].get(name) for name in RESOURCES},
            **{f"{name}_in_faults": including_faults[index].get(name) for name in ("open_files", "db_connections")},
            "loop_lag_p99_ms": lag.get("p99"), "loop_lag_p999_ms": lag.get("p999"),
            "runs_due": len(found.start_lags_by_slice[index]),
            "start_lag_p99_ms": everything["p99"], "start_lag_max_ms": everything["max"],
            "steady_start_lag_p99_ms": steady["p99"],
            "history_trimmed": int(trimmed[index]) if index < len(trimmed) else None,
        })
    return rows


def growth(rows: Sequence[Mapping[str, object]], name: str) -> float | None:
    """The largest maximum of ``name`` in a later slice over the first slice's after the warm-up
    (the second, when there are three slices or more): 1.0 is flat."""
    values = [row.get(name) for row in rows]
    if len(values) >= 3:
        values = values[1:]
    first = values[0] if values else None
    later = [value for value in values[1:] if isinstance(value, int | float)]
    if not isinstance(first, int | float) or first <= 0 or not later:
        return None
    return round(max(later) / first, 4)


def rss_slope_mib_per_hour(rows: Sequence[Mapping[str, object]], slice_s: float) -> float | None:
    """The least-squares slope of the slices' RSS over the second half of the soak, in MiB an hour:
    whether the node still grows once it has settled, which the ratio alone cannot tell."""
    half = [(index, value) for index, row in enumerate(rows)
            if index >= len(rows) // 2 and isinstance(value := row.get("rss_bytes"), int | float)]
    if len(half) < 3:
        return None
    mean_x = sum(index for index, _ in half) / len(half)
    mean_y = sum(value for _, value in half) / len(half)
    spread = sum((index - mean_x) ** 2 for index, _ in half)
    slope_per_slice = sum((index - mean_x) * (value - mean_y) for index, value in half) / spread
    return round(slope_per_slice * 3600 / slice_s / 2**20, 3)


def drift(rows: Sequence[Mapping[str, object]]) -> float | None:
    """The last slice's steady start-lag p99 over the first's."""
    if len(rows) < 2:
        return None
    first, last = rows[0].get("steady_start_lag_p99_ms"), rows[-1].get("steady_start_lag_p99_ms")
    if not isinstance(first, int | float) or not isinstance(last, int | float) or first <= 0:
        return None
    return round(last / first, 4)
