"""The soak benchmark's arithmetic: slices, resource maxima, occurrences accounted one by one,
growth and drift, its targets and its report."""

from __future__ import annotations

import math

import pytest
from fastlane.bench.report import render_markdown
from fastlane.bench.soak_figures import (
    FaultWindow,
    ResourceSamples,
    Slicing,
    account,
    drift,
    growth,
    periodic_instants,
    read_occurrences,
    rss_slope_mib_per_hour,
    slice_rows,
    slicing_for,
    workflow_steps,
)
from fastlane.bench.targets import evaluate

S = 1_000_000  # a second in microseconds


def line(run_id: str, scheduled: int, started: int, job_id: str = "job") -> str:
    """A no-op worker's record (bench/lag_worker.py): run, scheduled, released, received, job, started."""
    return f"{run_id} {scheduled} {scheduled} {scheduled} {job_id} {started}\n"


@pytest.mark.parametrize(("duration_s", "seconds", "count"), [
    (3600, 300, 12),  # an hour: five-minute slices
    (1800, 300, 6),
    (600, 100, 6),  # shorter than half an hour: sixths
    (72, 20, 4),  # but never under 20 s, and as many as come nearest the duration
    (200, 200 / 6, 6),  # a sixth that rounds up still makes six
    (3960, 300, 13),  # 1.1 h: thirteen five-minute slices
])
def test_a_soak_is_cut_into_five_minute_slices_or_sixths_of_a_short_run(duration_s: float, seconds: float,
                                                                         count: int) -> None:
    slicing = slicing_for(10 * S, duration_s)
    assert (slicing.seconds, slicing.count) == (seconds, count)
    assert slicing.index(10 * S) == 0
    assert slicing.index(10 * S - 1) is None  # before the soak
    assert slicing.index(10 * S + math.ceil(seconds * S)) == 1
    assert slicing.index(slicing.end_us) is None  # after its last slice


def test_each_slice_keeps_the_largest_sample_of_each_resource_and_a_missing_one_is_left_out() -> None:
    samples = ResourceSamples(Slicing(start_us=0, seconds=10, count=2))
    samples.add(1 * S, {"rss_bytes": 100, "db_connections": 5})
    samples.add(2 * S, {"rss_bytes": 90, "db_connections": None})  # the server restarting: no count
    samples.add(11 * S, {"rss_bytes": 120, "db_connections": 4})
    samples.add(25 * S, {"rss_bytes": 999})  # after the last slice
    assert samples.maxima() == [{"rss_bytes": 100, "db_connections": 5}, {"rss_bytes": 120, "db_connections": 4}]


def test_samples_inside_a_fault_window_are_left_out_of_the_steady_maxima_but_kept_apart() -> None:
    samples = ResourceSamples(Slicing(start_us=0, seconds=10, count=1))
    samples.add(1 * S, {"open_files": 30, "db_connections": 5})
    samples.add(4 * S, {"open_files": 33, "db_connections": 9})  # the pool refilling after a restart
    samples.add(8 * S, {"open_files": 31, "db_connections": 5})
    fault = FaultWindow("postgres", start_us=3 * S, end_us=6 * S)
    assert samples.maxima([fault]) == [{"open_files": 31, "db_connections": 5}]
    assert samples.maxima([fault], in_faults=True) == [{"open_files": 33, "db_connections": 9}]


def test_periodic_instants_are_the_phase_plus_whole_periods_within_the_range() -> None:
    assert list(periodic_instants(3 * S, 2 * S, 4 * S, 10 * S)) == [5 * S, 7 * S, 9 * S]
    assert list(periodic_instants(0, 5 * S, 10 * S, 20 * S)) == [10 * S, 15 * S]  # the start itself counts
    assert list(periodic_instants(0, 5 * S, 11 * S, 15 * S)) == []  # the end does not


def test_an_occurrence_never_run_is_lost_and_one_run_by_two_runs_is_twice() -> None:
    lines = [line("r1", 10 * S, 10 * S, "a"), line("r2", 12 * S, 12 * S, "a"),
             line("r3", 12 * S, 12 * S, "a"),  # a second run of a's occurrence at 12 s: twice
             line("r4", 10 * S, 10 * S, "b")]
    found = read_occurrences(lines, Slicing(start_us=10 * S, seconds=10, count=1), [])
    accounting = account({"a": [10 * S, 12 * S, 14 * S], "b": [10 * S]}, found)
    assert (accounting.expected, accounting.lost, accounting.twice) == (4, 1, 1)
    assert accounting.examples == (f"a@{14 * S}",)


def test_a_run_started_again_after_its_worker_was_killed_is_a_retry_not_a_second_run() -> None:
    lines = [line("r1", 10 * S, 10 * S + 500), line("r1", 10 * S, 40 * S)]  # the same run, its lease expired
    found = read_occurrences(lines, Slicing(start_us=10 * S, seconds=10, count=1), [])
    assert found.started_again == 1
    assert account({"job": [10 * S]}, found).twice == 0
    assert found.start_lags_by_slice == [[0.5]]  # its first start is the one measured


def test_start_lags_go_to_the_slice_the_run_was_due_in_and_fault_windows_are_left_out_of_the_steady_ones() -> None:
    slicing = Slicing(start_us=0, seconds=10, count=2)
    fault = FaultWindow("worker", start_us=12 * S, end_us=15 * S)
    lines = [line("r1", 1 * S, 1 * S + 1000), line("r2", 11 * S, 11 * S + 2000),
             line("r3", 13 * S, 13 * S + 9_000_000),  # due while the worker was away
             "torn line\n", line("r4", 30 * S, 30 * S)]  # after the soak: not in a slice
    found = read_occurrences(lines, slicing, [fault])
    assert found.start_lags_by_slice == [[1.0], [2.0, 9000.0]]
    assert found.steady_lags_by_slice == [[1.0], [2.0]]
    rows = slice_rows(slicing, ResourceSamples(slicing), [fault], found, [{"p99": 0.5, "p999": 2.5}], [7.0])
    assert rows[1]["start_lag_p99_ms"] == 9000.0 and rows[1]["steady_start_lag_p99_ms"] == 2.0
    assert rows[0]["loop_lag_p999_ms"] == 2.5 and rows[0]["history_trimmed"] == 7
    assert rows[1]["loop_lag_p99_ms"] is None and rows[1]["history_trimmed"] is None  # no scrape after it


def test_workflow_steps_that_ended_and_those_run_by_a_second_run() -> None:
    lines = ["S r1 w1 a 1\n", "E r1 w1 a 2\n", "S r2 w1 b 3\n", "S r3 w1 b 4\n", "E r3 w1 b 5\n", "garbled\n",
             "S r4 w1 c 6\n", "S r4 w1 c 9\n", "E r4 w1 c 10\n"]  # c: one run, entered again: a retry
    ended, twice = workflow_steps(lines)
    assert ended == {("w1", "a"), ("w1", "b"), ("w1", "c")} and twice == 1  # b only


def test_growth_is_the_largest_later_slice_over_the_first_after_the_warm_up_and_drift_the_last_over_the_first() -> None:
    rows = [{"rss_bytes": 80, "steady_start_lag_p99_ms": 2.0}, {"rss_bytes": 100, "steady_start_lag_p99_ms": 9.0},
            {"rss_bytes": 104, "steady_start_lag_p99_ms": 2.1}, {"rss_bytes": 103, "steady_start_lag_p99_ms": 2.1}]
    assert growth(rows, "rss_bytes") == 1.04  # the warm-up's 80 is not the baseline: the second slice's 100 is
    assert growth(rows + [{"rss_bytes": 120}], "rss_bytes") == 1.2  # a later slice that grows is caught
    assert drift(rows) == 1.05  # the last slice against the first, whatever came between
    assert growth(rows[:2], "rss_bytes") == 1.25  # two slices: the second against the first
    assert growth(rows[:1], "rss_bytes") is None and drift(rows[:1]) is None  # one slice: nothing to compare
    assert growth([{"rss_bytes": None}, {"rss_bytes": 5}], "rss_bytes") is None


def test_the_rss_slope_is_taken_over_the_second_half_in_mib_an_hour() -> None:
    mib = 2**20
    settled = [{"rss_bytes": 60 * mib}, {"rss_bytes": 70 * mib}] + [{"rss_bytes": 70 * mib} for _ in range(4)]
    assert rss_slope_mib_per_hour(settled, 300.0) == 0.0  # an early rise is not the settled node's
    growing = [{"rss_bytes": (70 + index) * mib} for index in range(6)]  # 1 MiB every five minutes
    assert rss_slope_mib_per_hour(growing, 300.0) == 12.0
    assert rss_slope_mib_per_hour(growing[:4], 300.0) is None  # two slices in the half: too few for a slope


def soak_document(*, rss_growth: float, lost: int, twice: int = 0, slices: int = 3) -> dict[str, object]:
    result = {"system": "fastlane", "scenario": "soak", "slices": [{"slice": n + 1} for n in range(slices)],
              "growth": {"rss_bytes": rss_growth, "open_files": 1.0, "threads": 1.0, "db_connections": 1.0},
              "start_lag_drift": 1.02, "occurrences_expected": 1000, "lost": lost, "twice": twice,
              "workflow_steps_expected": 30, "workflow_steps_lost": 0, "workflow_steps_twice": 0,
              "faults": {"worker": 3, "postgres": 3}}
    return {"scenario": "soak", "results": [result]}


def test_soak_targets_fail_when_a_resource_grows_or_an_occurrence_is_lost_or_run_twice() -> None:
    met = {target.name: target.status.value for target in evaluate(soak_document(rss_growth=1.04, lost=0))}
    assert set(met.values()) == {"MET"} and len(met) == 7
    grown = {target.name: target.status.value for target in evaluate(soak_document(rss_growth=1.2, lost=1, twice=1))}
    assert sorted(name for name, status in grown.items() if status == "MISSED") == [
        "soak: RSS outside faults, largest later slice / first after the warm-up (≤1.05)", "soak: occurrences and workflow steps lost (0)",
        "soak: occurrences run twice, workflow steps started twice (0)"]


def test_a_soak_of_one_slice_cannot_speak_to_growth() -> None:
    statuses = {target.name: target.status.value for target in evaluate(soak_document(rss_growth=9.0, lost=0, slices=1))}
    assert statuses["soak: RSS outside faults, largest later slice / first after the warm-up (≤1.05)"] == "N/A"


def test_the_soak_report_has_a_row_per_slice_and_the_counts_of_faults() -> None:
    document = soak_document(rss_growth=1.0, lost=0)
    document["results"][0]["slices"] = [{"slice": 1, "from_s": 0, "rss_bytes": 64 << 20, "start_lag_p99_ms": 0.4}]
    text = render_markdown(document)
    assert "| 1 | 0 | 64.0 MiB |" in text
    assert "worker 3, postgres 3" in text


def test_the_soak_result_accounts_every_occurrence_from_the_workers_records(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from fastlane.bench.scenarios.soak import WORKFLOW_STEPS, Load, _figures

    slicing = Slicing(start_us=0, seconds=10, count=2)
    record, steps = tmp_path / "received.txt", tmp_path / "steps.txt"
    # An interval job every 5 s from 0 (its instant at 15 s never ran), and a one-shot at 12 s.
    record.write_text(line("r1", 0, 1000, "every") + line("r2", 5 * S, 5 * S + 2000, "every")
                      + line("r3", 10 * S, 10 * S + 500, "every") + line("r4", 12 * S, 12 * S + 700, "once"))
    steps.write_text("".join(f"S s-{step} w1 {step} 1\nE s-{step} w1 {step} 2\n" for step in WORKFLOW_STEPS))
    run = SimpleNamespace(slicing=slicing, faults=[], load=Load(one_shots={"once": 12 * S}, workflow_runs=["w1"]),
                          scrapes=[{"fastlane_history_trimmed_total": 0.0}, {"fastlane_history_trimmed_total": 40.0}],
                          resources=ResourceSamples(slicing))
    bench = SimpleNamespace(backend="sqlite", hours=None)
    result = _figures(bench, run, {"every": (0, 5 * S)}, record, steps, None)  # type: ignore[arg-type]
    assert (result["occurrences_expected"], result["lost"], result["twice"]) == (5, 1, 0)
    assert result["lost_examples"] == [f"every@{15 * S}"]
    assert (result["workflow_steps_expected"], result["workflow_steps_lost"]) == (len(WORKFLOW_STEPS), 0)
    rows = result["slices"]
    assert [row["runs_due"] for row in rows] == [2, 2] and rows[0]["history_trimmed"] == 40
