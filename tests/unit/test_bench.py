"""The benchmark harness: its pure arithmetic and reports exactly, and one quick real run (e2e)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from fastlane.bench.cpu_wait import CpuWait
from fastlane.bench.harness import Bench, Progress, RecordTail, system_result
from fastlane.bench.processes import ROOT, child_environment
from fastlane.bench.report import render_markdown, to_json, write_outputs
from fastlane.bench.runner import _keep_logs, build_document
from fastlane.bench.scenarios import cron, failover, scale
from fastlane.bench.stats import (
    RunRecord,
    Status,
    Target,
    deliveries,
    delivery_span_s,
    histogram_quantiles,
    lag_ratios,
    late_starts_waiting_for_cpu,
    parse_record,
    percentiles,
    ratio,
    runs_per_second,
    stall_causes,
)
from fastlane.bench.targets import evaluate
from fastlane.bench.usage import ProcessMemory, cpu_seconds

from fastlane.cli.main import main

LAG_KEYS = {"p50", "p95", "p99", "p999", "max"}


def record(run_id: str, scheduled: int, released: int, received: int, job_id: str = "", started: int = 0) -> RunRecord:
    return RunRecord(run_id=run_id, scheduled_us=scheduled, released_us=released, received_us=received, job_id=job_id,
                     started_us=started)


def lags(p50: float, p95: float, p99: float, p999: float, top: float) -> dict[str, float]:
    return {"p50": p50, "p95": p95, "p99": p99, "p999": p999, "max": top}


# -- percentiles -------------------------------------------------------------------------------


def test_percentiles_are_nearest_rank_on_exact_fractions() -> None:
    assert percentiles(range(1, 1001)) == {"p50": 500, "p95": 950, "p99": 990, "p999": 999, "max": 1000}


def test_percentiles_of_few_values_are_observed_values() -> None:
    assert percentiles([float(value) for value in range(10, 0, -1)]) == lags(5.0, 10.0, 10.0, 10.0, 10.0)
    assert percentiles([7.25]) == lags(7.25, 7.25, 7.25, 7.25, 7.25)


def test_percentiles_round_to_microseconds_in_milliseconds() -> None:
    assert percentiles([0.0004, 1.23456]) == lags(0.0, 1.235, 1.235, 1.235, 1.235)


def test_percentiles_of_nothing_are_none() -> None:
    assert percentiles([]) == dict.fromkeys(LAG_KEYS)


# -- records and deliveries --------------------------------------------------------------------


def test_a_worker_line_parses_with_or_without_its_job_id() -> None:
    assert parse_record("r1 100 150 400 job-9") == record("r1", 100, 150, 400, "job-9")
    assert parse_record("r1 100 0 400\n") == record("r1", 100, 0, 400)


def test_a_worker_line_with_the_handler_start_parses_it_and_older_lines_have_none() -> None:
    assert parse_record("r1 100 150 40 job-9 120\n") == record("r1", 100, 150, 40, "job-9", started=120)
    assert parse_record("r1 100 150 400 job-9").started_us == 0  # type: ignore[union-attr]


def test_start_lags_come_from_records_that_say_when_the_handler_started() -> None:
    got = deliveries([
        record("a", 1_000, 800, 900, started=1_200),  # sent ahead: received before it was due
        record("b", 2_000, 2_100, 2_500),  # an older worker's line: no start
    ])
    assert got.start_lags_ms() == [0.2]
    assert sorted(got.delivery_lags_ms()) == [-0.1, 0.5]


def test_a_worker_line_with_the_loop_threads_cpu_wait_parses_it_and_other_fields_are_left() -> None:
    parsed = parse_record("r1 100 150 40 job-9 120 cpu_wait_us=2500\n")
    assert parsed == RunRecord(run_id="r1", scheduled_us=100, released_us=150, received_us=40, job_id="job-9",
                               started_us=120, cpu_wait_us=2500)
    assert parse_record("r1 100 150 40 job-9 120 tenant-a").cpu_wait_us is None  # type: ignore[union-attr]
    assert parse_record("r1 100 150 40 job-9 120").cpu_wait_us is None  # type: ignore[union-attr]
    garbled = parse_record("r1 100 150 40 job-9 120 cpu_wait_us=x")  # a diagnostic: the run keeps its record
    assert garbled is not None and garbled.started_us == 120 and garbled.cpu_wait_us is None


def test_late_starts_are_put_down_to_a_cpu_wait_when_the_thread_waited_half_as_long_or_more() -> None:
    def run(run_id: str, late_us: int, waited_us: int | None) -> RunRecord:
        return RunRecord(run_id=run_id, scheduled_us=10_000, released_us=0, received_us=9_000,
                         started_us=10_000 + late_us, cpu_wait_us=waited_us)

    figures = late_starts_waiting_for_cpu([
        run("on-time", 100, 0),
        run("late, thread waited", 2_000, 1_000),  # exactly half: counted
        run("late, thread barely waited", 3_000, 1_499),
        run("late by exactly the threshold", 1_000, 900),
        run("an older worker's line", 5_000, None),  # says nothing of the wait: left out
    ])
    assert figures == {
        "late_starts": 3,
        "late_starts_waiting_for_cpu": 2,
        "worker_cpu_wait_ms": percentiles([0.0, 1.0, 1.499, 0.9]),
    }
    assert late_starts_waiting_for_cpu([run("peer", 2_000, None)]) == {}


def test_the_cpu_wait_counter_reads_increments_of_the_run_queue_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([b"5 3000000 7\n", b"6 4500000 8\n", b"garbled\n", b"7 4600000 9\n", b"8 4700000 9\n"])
    monkeypatch.setattr("fastlane.runtime.run_queue.os.open", lambda path, flags: 99)
    monkeypatch.setattr("fastlane.runtime.run_queue.os.pread", lambda fd, size, offset: next(readings))
    counter = CpuWait()
    assert counter.since_last_us() is None  # the first start: before it lay the worker's start-up
    assert counter.since_last_us() == 1500  # (4,500,000 - 3,000,000) ns
    assert counter.since_last_us() is None  # a reading the kernel garbled says nothing
    assert counter.since_last_us() is None  # nor the one after it: no base to count from
    assert counter.since_last_us() == 100


def test_the_cpu_wait_counter_says_nothing_without_the_kernels_file_or_on_another_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_such_file(path: str, flags: int) -> int:
        raise FileNotFoundError(path)

    with monkeypatch.context() as patch:
        patch.setattr("fastlane.runtime.run_queue.os.open", no_such_file)
        absent = CpuWait()
        assert [absent.since_last_us(), absent.since_last_us()] == [None, None]
    if not Path("/proc/thread-self/schedstat").exists():
        return  # the rest needs the real file
    counter = CpuWait()
    assert counter.since_last_us() is None
    waited = counter.since_last_us()
    assert waited is not None and waited >= 0  # this thread's: readable
    on_another: list[int | None] = []
    thread = threading.Thread(target=lambda: on_another.append(counter.since_last_us()))
    thread.start()
    thread.join()
    assert on_another == [None]  # the descriptor is this thread's: another thread's read says nothing


@pytest.mark.parametrize("line", ["", "r1 100 150", "r1 100 x 400", "   ", "r1 100 150 400 j1 x"])
def test_blank_torn_or_garbled_lines_are_skipped(line: str) -> None:
    assert parse_record(line) is None


def test_a_run_received_again_is_a_duplicate_and_its_first_receipt_counts() -> None:
    got = deliveries([
        record("a", 1_000, 1_500, 3_000),
        record("b", 2_000, 0, 2_500),
        record("a", 1_000, 1_400, 2_000),  # an earlier receipt, read later (another worker's file)
        record("a", 1_000, 1_500, 9_000),
    ])
    assert got.delivered == 2
    assert got.duplicates == 2
    assert sorted(got.delivery_lags_ms()) == [0.5, 1.0]
    assert got.release_lags_ms() == [0.4]  # b's node said nothing about its release


def test_runs_per_second_over_the_delivery_span() -> None:
    records = [record("a", 1_000_000, 0, 1_500_000), record("b", 2_000_000, 0, 3_000_000)]
    assert delivery_span_s(records) == 2.0
    assert runs_per_second(len(records), delivery_span_s(records)) == 1.0
    assert delivery_span_s([]) is None
    assert runs_per_second(5, None) is None
    assert runs_per_second(5, 0.0) is None


def test_record_tail_reads_only_what_is_new_and_waits_for_unfinished_lines(tmp_path: Path) -> None:
    path = tmp_path / "received.txt"
    tail = RecordTail([path, tmp_path / "absent.txt"])
    assert tail.read() == 0
    path.write_text("r1 1 2 3 j1\nr2 4 5")
    assert tail.read() == 1
    with path.open("a") as handle:
        handle.write(" 6 j2\n")
    assert tail.read() == 2
    assert [entry.run_id for entry in tail.records] == ["r1", "r2"]
    assert tail.records[1] == record("r2", 4, 5, 6, "j2")
    with path.open("a") as handle:
        handle.write("r3 7 8 9 j3 10\n")  # a worker that records the handler's start
    assert tail.read() == 3
    assert tail.records[2] == record("r3", 7, 8, 9, "j3", started=10)


def test_a_result_reports_start_lag_beside_delivery_and_release_lag(tmp_path: Path) -> None:
    bench = Bench(scenario="spread", backend="sqlite", nodes=1, workers=1, scale=1.0, workdir=tmp_path)
    ahead = deliveries([record("a", 10_000, 7_000, 8_000, started=10_300),
                        record("b", 20_000, 17_000, 18_000, started=20_100)])
    result = system_result(bench, "fastlane", jobs=2, got=ahead)
    assert result["start_lag_ms"] == {"p50": 0.1, "p95": 0.3, "p99": 0.3, "p999": 0.3, "max": 0.3}
    assert result["delivery_lag_ms"] == {"p50": -2.0, "p95": -2.0, "p99": -2.0, "p999": -2.0, "max": -2.0}
    assert sorted(bench.samples["fastlane (start)"]) == [0.1, 0.3]
    peer = deliveries([record("a", 10_000, 10_500, 10_500, started=10_500)])  # called = started
    peer_result = system_result(bench, "apscheduler-memory", jobs=1, got=peer)
    assert "apscheduler-memory (start)" not in bench.samples
    assert "late_starts" not in peer_result  # no record says how long a thread waited for a CPU


def test_the_report_says_how_durable_postgresql_was() -> None:
    report = render_markdown({"scenario": "sustained", "backend": "postgres", "results": [],
                              "postgres": {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}})
    assert "PostgreSQL: fsync on, synchronous_commit on, full_page_writes on." in report
    assert "PostgreSQL:" not in render_markdown({"scenario": "sustained", "backend": "sqlite", "results": []})


def test_a_result_says_how_many_late_starts_waited_for_a_cpu_and_the_report_shows_it(tmp_path: Path) -> None:
    bench = Bench(scenario="spread", backend="postgres", nodes=1, workers=1, scale=1.0, workdir=tmp_path)
    got = deliveries([RunRecord(run_id="a", scheduled_us=10_000, released_us=0, received_us=9_000, started_us=13_000,
                                cpu_wait_us=2_800),
                      RunRecord(run_id="b", scheduled_us=20_000, released_us=0, received_us=19_000,
                                started_us=20_050, cpu_wait_us=0)])
    result = system_result(bench, "fastlane", jobs=2, got=got)
    assert (result["late_starts"], result["late_starts_waiting_for_cpu"]) == (1, 1)
    assert result["worker_cpu_wait_ms"] == percentiles([2.8, 0.0])
    report = render_markdown({"scenario": "spread", "backend": "postgres", "results": [result]})
    assert "| runs started 1 ms or more late | 1 |" in report
    assert "| of those, the worker's loop thread waited for a CPU half as long or more | 1 |" in report
    assert "| worker loop thread's wait for a CPU between starts (p50 / p99 / max) | 0.000 / 2.800 / 2.800 ms |" in report


# -- ratios and targets ------------------------------------------------------------------------


def test_ratio_keeps_four_significant_digits() -> None:
    assert ratio(2, 3) == 0.6667
    assert ratio(10, 3) == 3.333
    assert ratio(1000, 3) == 333.3
    assert ratio(0, 3) == 0.0
    assert ratio(1, 0) is None
    assert ratio(None, 3) is None
    assert ratio(3, None) is None


def test_lag_ratios_divide_every_figure_of_every_lag() -> None:
    ours = {"start_lag_ms": lags(1, 1, 2, 2, 4), "delivery_lag_ms": lags(1, 2, 3, 4, 5),
            "release_lag_ms": lags(1, 1, 1, 1, 1)}
    theirs = {"start_lag_ms": lags(2, 4, 30, 40, 0), "delivery_lag_ms": lags(2, 4, 30, 40, 0),
              "release_lag_ms": lags(4, 4, 4, 4, 4)}
    assert lag_ratios(ours, theirs) == {
        "start_lag_ms": {"p50": 0.5, "p95": 0.25, "p99": 0.06667, "p999": 0.05, "max": None},
        "delivery_lag_ms": {"p50": 0.5, "p95": 0.5, "p99": 0.1, "p999": 0.1, "max": None},
        "release_lag_ms": dict.fromkeys(LAG_KEYS, 0.25),
    }


def test_lag_ratios_of_a_result_without_start_lags_are_none() -> None:
    old = {"delivery_lag_ms": lags(1, 2, 3, 4, 5), "release_lag_ms": lags(1, 1, 1, 1, 1)}
    assert lag_ratios(old, old)["start_lag_ms"] == dict.fromkeys(LAG_KEYS)


@pytest.mark.parametrize(
    ("op", "measured", "applies", "expected"),
    [
        ("<=", 5.0, True, Status.MET),
        ("<=", 5.001, True, Status.MISSED),
        (">=", 10_000.0, True, Status.MET),
        (">=", 9_999.9, True, Status.MISSED),
        ("<=", None, True, Status.NOT_APPLICABLE),
        ("<=", 1.0, False, Status.NOT_APPLICABLE),
        ("<=", float("inf"), True, Status.MISSED),
    ],
)
def test_target_status(op: str, measured: float | None, applies: bool, expected: Status) -> None:
    limit = 10_000.0 if op == ">=" else 5.0
    target = Target(name="t", limit=limit, op=op, unit="ms", measured=measured, applies=applies)
    assert target.status is expected


def test_a_target_with_an_unknown_operator_is_an_error() -> None:
    with pytest.raises(ValueError, match="operator"):
        _ = Target(name="t", limit=1, op="<", unit="", measured=0.5).status


def spread_document() -> dict[str, object]:
    return {
        "scenario": "spread", "backend": "sqlite", "nodes": 1, "scale": 1.0,
        "results": [
            {"system": "fastlane", "jobs": 30_000, "delivered": 30_000, "duplicates": 0, "runs_per_s": 1000.5,
             "start_lag_ms": lags(0.05, 0.1, 0.8, 1.2, 2.0),
             "delivery_lag_ms": lags(0.5, 1.5, 3.0, 6.0, 9.0), "release_lag_ms": lags(0.1, 0.2, 0.3, 0.4, 0.5)},
            {"system": "apscheduler-memory", "jobs": 30_000, "delivered": 30_000, "duplicates": 0, "runs_per_s": 999.0,
             "start_lag_ms": lags(0.1, 0.5, 1.0, 2.0, 3.0),
             "delivery_lag_ms": lags(0.1, 0.5, 1.0, 2.0, 3.0), "release_lag_ms": lags(0.1, 0.5, 1.0, 2.0, 3.0)},
            {"system": "apscheduler-sqlalchemy", "jobs": 30_000, "delivered": 30_000, "duplicates": 0,
             "runs_per_s": 800.0, "start_lag_ms": lags(10, 20, 60, 80, 100), "delivery_lag_ms": lags(10, 20, 60, 80, 100),
             "release_lag_ms": lags(10, 20, 60, 80, 100)},
        ],
    }


def test_spread_targets_compare_fastlane_with_both_peers() -> None:
    targets = evaluate(spread_document())
    assert [(t.measured, t.limit, t.status) for t in targets] == [
        (3.0, 5.0, Status.MET),
        (0.05, 0.1, Status.MET),  # 3 ms against 60 ms: 20x lower
        (3.0, 2.0, Status.MISSED),  # 3 ms against 1 ms
        (0.8, 1.0, Status.MET),  # start lag: 0.8 ms against 1 ms
        (0.01333, 0.1, Status.MET),  # start lag: 0.8 ms against 60 ms
    ]
    assert [t.name for t in targets][3:] == [
        "spread p99 start lag vs APScheduler in-memory store (≤1x)",
        "spread p99 start lag vs APScheduler + SQLAlchemy store (≥10x lower)",
    ]


def test_spread_targets_without_the_peer_do_not_apply() -> None:
    document = spread_document()
    document["results"] = document["results"][:1]  # type: ignore[index]
    statuses = [target.status for target in evaluate(document)]
    assert statuses == [Status.MET] + [Status.NOT_APPLICABLE] * 4


def test_spread_start_targets_without_start_lags_do_not_apply_and_say_why() -> None:
    document = spread_document()
    for result in document["results"]:  # type: ignore[attr-defined]
        del result["start_lag_ms"]
    targets = evaluate(document)
    assert [t.status for t in targets][3:] == [Status.NOT_APPLICABLE] * 2
    assert targets[3].note == "no start lag recorded (a worker or peer from before the start column)"


def test_a_burst_with_runs_missing_misses_its_target_whatever_the_last_arrival() -> None:
    document = {"scenario": "burst", "results": [
        {"system": "fastlane", "jobs": 100_000, "delivered": 99_999, "last_delivery_after_instant_s": 0.9}]}
    (target,) = evaluate(document)
    assert target.status is Status.MISSED
    assert target.measured == float("inf")
    assert target.note == "only 99,999 of 100,000 delivered"


def test_a_complete_scaled_burst_is_judged_by_its_last_arrival() -> None:
    document = {"scenario": "burst", "results": [
        {"system": "fastlane", "jobs": 5_000, "delivered": 5_000, "last_delivery_after_instant_s": 0.28}]}
    (target,) = evaluate(document)
    assert (target.measured, target.status) == (0.28, Status.MET)
    assert target.note == "measured with 5,000 jobs; the target is stated for 100,000"


def test_sustained_target_applies_only_to_postgres_with_one_node() -> None:
    result = {"system": "fastlane", "runs_per_s": 12_000.0, "offered_runs_per_s": 20_000.0}
    on_postgres = evaluate({"scenario": "sustained", "backend": "postgres", "nodes": 1, "results": [result]})
    on_sqlite = evaluate({"scenario": "sustained", "backend": "sqlite", "nodes": 1, "results": [result]})
    assert on_postgres[0].status is Status.MET
    assert on_sqlite[0].status is Status.NOT_APPLICABLE


def test_scale_and_failover_targets() -> None:
    scale = evaluate({"scenario": "scale", "results": [
        {"system": "fastlane", "window_jobs": 100_000, "bytes_per_window_job": 650.0, "rebuild_s": 1.5}]})
    assert [(t.measured, t.status) for t in scale] == [(650.0, Status.MISSED), (1.5, Status.MET)]
    failover_targets = evaluate({"scenario": "failover", "results": [
        {"system": "fastlane", "lease_ttl_s": 5.0, "failover_gap_s": 6.2}]})
    assert [(t.limit, t.measured, t.status) for t in failover_targets] == [(6.0, 6.2, Status.MISSED)]


# -- reports -----------------------------------------------------------------------------------


def test_markdown_report_has_results_ratios_and_targets() -> None:
    document = spread_document()
    fastlane, memory, sql = document["results"]  # type: ignore[misc]
    document["ratios"] = {"apscheduler-memory": lag_ratios(fastlane, memory),
                          "apscheduler-sqlalchemy": lag_ratios(fastlane, sql)}
    document["targets"] = [target.as_json() for target in evaluate(document)]
    document["processes"] = [{"name": "fastlane node-1", "pid": 42, "peak_rss_bytes": 3 * (1 << 20), "cpu_s": 12.5,
                              "realtime_threads": 0},
                             {"name": "fastlane worker-1", "pid": 43, "peak_rss_bytes": 1 << 20, "cpu_s": 1.5,
                              "realtime_threads": 1}]
    document["realtime_priority"] = 1
    document["notes"] = ["a note"]
    text = render_markdown(document)
    lines = text.splitlines()
    assert lines[0] == "# fastlane bench: spread"
    assert ("| fastlane | 30,000 | 30,000 | 0 | 0.050 | 0.100 | 0.800 | 1.200 | 2.000 "
            "| 0.500 | 1.500 | 3.000 | 6.000 | 9.000 "
            "| 0.100 | 0.200 | 0.300 | 0.400 | 0.500 | 1,000.5 |") in lines
    assert "| delivery p99 | 3 | 0.05 |" in lines
    assert "| start p99 | 0.8 | 0.0133 |" in lines
    assert "| start p99.9 | 0.6 | 0.015 |" in lines
    assert "| start max | 0.667 | 0.02 |" in lines
    assert "| spread p99 start lag vs APScheduler in-memory store (≤1x) | 0.8 ratio | <= 1 ratio | MET |  |" in lines
    assert "| spread p99 delivery lag | 3 ms | <= 5 ms | MET |  |" in lines
    assert "| spread p99 vs APScheduler in-memory store (≤2x) | 3 ratio | <= 2 ratio | MISSED |  |" in lines
    assert "| fastlane node-1 | 42 | 3.0 MiB | 12.5 | 0 |" in lines
    assert "| fastlane worker-1 | 43 | 1.0 MiB | 1.5 | 1 |" in lines
    assert any(line.startswith("Threads that start runs") and "SCHED_FIFO priority 1" in line for line in lines)
    assert lines[-1] == "- a note"


def test_the_document_carries_ratios_to_each_peer_targets_and_memory(tmp_path: Path) -> None:
    bench = Bench(scenario="spread", backend="sqlite", nodes=1, workers=1, scale=1.0, workdir=tmp_path)
    bench.memory.append(ProcessMemory("fastlane node-1", 42, 1 << 20))
    bench.note("a note")
    results = spread_document()["results"]
    started_at = datetime(2030, 1, 1, tzinfo=UTC)
    document = build_document(bench, results, started_at=started_at, elapsed_s=12.34)  # type: ignore[arg-type]
    assert list(document["ratios"]) == ["apscheduler-memory", "apscheduler-sqlalchemy"]
    assert document["ratios"]["apscheduler-sqlalchemy"]["delivery_lag_ms"]["p99"] == 0.05
    assert document["ratios"]["apscheduler-memory"]["start_lag_ms"]["p99"] == 0.8
    assert [target["status"] for target in document["targets"]] == ["MET", "MET", "MISSED", "MET", "MET"]
    assert [entry["name"] for entry in document["processes"]] == ["fastlane node-1", "harness"]
    assert (document["notes"], document["elapsed_s"], document["started_at"]) == (
        ["a note"], 12.3, "2030-01-01T00:00:00+00:00")
    # Every result says how fast this machine ran a fixed Python loop, to judge figures against.
    assert document["machine"]["speed_reference_ms"] > 0


def test_json_turns_infinity_into_null() -> None:
    assert orjson.loads(to_json({"measured": float("inf")})) == {"measured": None}


def test_outputs_are_written_to_the_directory(tmp_path: Path) -> None:
    document = spread_document()
    written = write_outputs(document, tmp_path / "out", {"fastlane": [0.5, 1.0, 2.0]})
    names = {path.name for path in written}
    assert {"result.json", "result.md"} <= names
    assert orjson.loads((tmp_path / "out" / "result.json").read_bytes())["scenario"] == "spread"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "lag.png" not in names
    else:
        assert (tmp_path / "out" / "lag.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_off_a_terminal_prints_each_phase_once_at_its_end() -> None:
    stream = io.StringIO()
    progress = Progress(stream, width=10, log_interval=3600)
    progress.phase("creating jobs")
    progress.update(5, 10, force=True)
    progress.update(10, 10)
    progress.phase("runs received")
    progress.end()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("creating jobs") and "[##########] 10/10" in lines[0]
    assert lines[1].startswith("runs received")


# -- scenario arithmetic -----------------------------------------------------------------------


@pytest.mark.parametrize(("scale", "period", "text"), [
    (1.0, 60, "* * * * *"), (0.5, 30, "*/30 * * * * *"), (0.1, 6, "*/6 * * * * *"), (0.01, 5, "*/5 * * * * *"),
])
def test_cron_period_and_expression_follow_the_scale(scale: float, period: int, text: str) -> None:
    assert cron.period_s(scale) == period
    assert cron.expression(period) == text


def test_cron_next_boundary_is_strictly_after() -> None:
    at = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert cron.next_boundary(at, 5) == datetime(2030, 1, 1, 12, 0, 5, tzinfo=UTC)
    assert cron.next_boundary(at.replace(second=59, microsecond=1), 60) == datetime(2030, 1, 1, 12, 1, tzinfo=UTC)


def test_failover_counts_occurrences_never_delivered() -> None:
    second = 1_000_000
    got = deliveries([
        record("a0", 10 * second + 250_000, 0, 0, "a"),  # before the kill: gives job a's phase
        record("a2", 12 * second + 250_000, 0, 0, "a"),  # 11.25 and 13.25 s never came
        record("b0", 10 * second + 500_000, 0, 0, "b"),  # job b: not watched
    ])
    assert failover._missing(got, lambda entry: entry.job_id == "a", 11 * second, 14 * second) == 2


# -- the command -------------------------------------------------------------------------------


def test_bench_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--backend", "--nodes", "--workers", "--scale", "--durable", "--realtime-priority", "--json", "--out",
                 "--hours", "--repeat", "soak", "spread", "burst",
                 "sustained", "cron", "scale", "failover"):
        assert flag in text


@pytest.mark.parametrize("argv", [
    ["bench", "failover"],
    ["bench", "failover", "--backend", "postgres", "--nodes", "2"],
    ["bench", "spread", "--nodes", "2"],
    ["bench", "spread", "--scale", "0"],
    ["bench", "nothing"],
    ["bench", "sustained", "--durable"],  # durable applies to PostgreSQL
    ["bench", "spread", "--realtime-priority", "100"],
    ["bench", "spread", "--realtime-priority", "-1"],
    ["bench", "spread", "--realtime-priority", "x"],
    ["bench", "spread", "--hours", "1"],  # hours are the soak's
    ["bench", "soak", "--hours", "0"],
    ["bench", "soak", "--hours", "nan"],
    ["bench", "soak", "--hours", "169"],
    ["bench", "soak", "--scale", "0.5"],
    ["bench", "soak", "--backend", "postgres", "--nodes", "2"],
    ["bench", "soak", "--repeat", "2"],
    ["bench", "soak", "--workers", "3"],
    ["bench", "spread", "--repeat", "0"],
    ["bench", "spread", "--repeat", "101"],
])
def test_bench_refuses_impossible_combinations(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "usage:" in err or "--help` lists its flags" in err


@pytest.mark.e2e
def test_a_tiny_spread_run_delivers_every_job_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, "-m", "fastlane", "bench", "spread", "--scale", "0.01", "--json", "--out", str(out)],
        cwd=ROOT, env=child_environment(), capture_output=True, timeout=240, check=False,
    )
    assert completed.returncode == 0, completed.stderr.decode()[-3000:]
    document = orjson.loads(completed.stdout)
    assert document == orjson.loads((out / "result.json").read_bytes())
    (fastlane,) = [result for result in document["results"] if result["system"] == "fastlane"]
    assert {"system", "scenario", "backend", "jobs", "delivered", "duplicates", "start_lag_ms", "delivery_lag_ms",
            "release_lag_ms", "runs_per_s"} <= set(fastlane)
    assert fastlane["jobs"] == 300
    assert fastlane["delivered"] == fastlane["jobs"]
    assert fastlane["duplicates"] == 0
    assert set(fastlane["delivery_lag_ms"]) == LAG_KEYS
    assert set(fastlane["release_lag_ms"]) == LAG_KEYS
    assert all(value is not None for value in fastlane["delivery_lag_ms"].values())
    assert all(value is not None for value in fastlane["start_lag_ms"].values())  # the worker records its starts
    if Path("/proc/thread-self/schedstat").exists():  # Linux: the worker also says how long it waited for a CPU
        assert "late_starts" in fastlane, "the worker recorded no wait for a CPU, though this kernel counts them"
        assert 0 <= fastlane["late_starts_waiting_for_cpu"] <= fastlane["late_starts"] <= fastlane["jobs"]
        assert set(fastlane["worker_cpu_wait_ms"]) == LAG_KEYS
    assert (fastlane["scenario"], fastlane["backend"]) == ("spread", "sqlite")
    assert document["targets"][0]["name"] == "spread p99 delivery lag"
    # The threads that start runs ran under real-time scheduling (the suite has CAP_SYS_NICE), and
    # only those: one thread of the worker, one of each peer, none of the node.
    assert document["realtime_priority"] == 1
    threads = {process["name"]: process["realtime_threads"] for process in document["processes"]}
    assert threads == {"fastlane node-1": 0, "fastlane worker-1": 1, "apscheduler-memory": 1,
                       "apscheduler-sqlalchemy": 1, "harness": None}
    assert (out / "result.md").read_text().startswith("# fastlane bench: spread")


@pytest.mark.e2e
def test_a_repeated_tiny_spread_reports_each_run_and_the_worst(tmp_path: Path) -> None:
    out = tmp_path / "out"
    completed = subprocess.run(
        [sys.executable, "-m", "fastlane", "bench", "spread", "--scale", "0.01", "--no-peer", "--repeat", "2", "--json",
         "--out", str(out)],
        cwd=ROOT, env=child_environment(), capture_output=True, timeout=300, check=False,
    )
    assert completed.returncode == 0, completed.stderr.decode()[-3000:]
    document = orjson.loads(completed.stdout)
    assert document["repeat"] == 2 and len(document["runs"]) == 2
    p99s = [next(r for r in run["results"] if r["system"] == "fastlane")["start_lag_ms"]["p99"]
            for run in document["runs"]]
    assert document["worst"]["fastlane"]["p99"] == max(p99s)
    assert all((out / f"run-{index}" / "result.json").exists() for index in (1, 2))  # each run kept its own
    assert (out / "result.md").read_text().startswith("# fastlane bench: spread, 2 runs")


@pytest.mark.e2e
def test_a_secure_spread_run_measures_fastlane_with_tls_and_a_token_beside_the_plain_one(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "fastlane", "bench", "spread", "--scale", "0.01", "--no-peer", "--secure", "--json",
         "--out", str(tmp_path / "out")],
        cwd=ROOT, env=child_environment(), capture_output=True, timeout=240, check=False,
    )
    assert completed.returncode == 0, completed.stderr.decode()[-3000:]
    document = orjson.loads(completed.stdout)
    by_system = {result["system"]: result for result in document["results"]}
    assert set(by_system) == {"fastlane", "fastlane-tls-token"}
    for result in by_system.values():
        assert result["delivered"] == result["jobs"] == 300
        assert result["duplicates"] == 0
    [cost] = [t for t in document["targets"] if t["name"].startswith("spread p99 start lag with TLS and a token")]
    assert cost["measured"] == pytest.approx(by_system["fastlane-tls-token"]["start_lag_ms"]["p99"]
                                             / by_system["fastlane"]["start_lag_ms"]["p99"], rel=1e-3)
    node_log = (tmp_path / "out" / "logs" / "fastlane-secure-node-1.log").read_text()
    assert "API tokens required, TLS" in node_log  # the second node really ran with both


def test_loop_lag_quantiles_come_from_the_bucket_counts_between_two_scrapes() -> None:
    def scrape(counts: list[float]) -> dict[str, float]:
        bounds = ["0.001", "0.005", "0.01", "+Inf"]
        return {f'lag_bucket{{le="{bound}"}}': count for bound, count in zip(bounds, counts, strict=True)}

    before = scrape([100, 100, 100, 100])  # what came before the measuring window is left out
    after = scrape([190, 199, 200, 200])  # 90 under 1 ms, 9 under 5 ms, 1 under 10 ms
    figures = histogram_quantiles(before, after, "lag", {"p50": 0.5, "p99": 0.99, "p999": 0.999})
    assert figures == {"p50": 1.0, "p99": 5.0, "p999": 10.0, "samples": 100}
    assert histogram_quantiles(after, after, "lag", {"p50": 0.5})["p50"] is None  # nothing observed


def test_stall_causes_are_the_labels_that_grew_most() -> None:
    before = {'stalls{cause="gc"}': 5.0, 'stalls{cause="other"}': 1.0}
    after = {'stalls{cause="gc"}': 6.0, 'stalls{cause="other"}': 4.0, 'stalls{cause="mod:f"}': 2.0}
    assert stall_causes(before, after, "stalls") == {"other": 3.0, "mod:f": 2.0, "gc": 1.0}


def test_cpu_seconds_of_a_process_grow_as_it_works_and_are_none_once_it_is_gone() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn 50 ms of CPU
        pass
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None and after >= before + 0.03
    assert cpu_seconds(None) is None and cpu_seconds(2**22 + 12345) is None  # above pid_max: no such process


@pytest.mark.parametrize("priority", [1, 0])
def test_a_worker_or_peer_without_a_real_time_thread_is_noted_when_one_was_asked_for(tmp_path: Path,
                                                                                       priority: int) -> None:
    bench = Bench(scenario="spread", backend="sqlite", nodes=1, workers=2, scale=1.0, workdir=tmp_path,
                  realtime_priority=priority)
    bench.memory += [ProcessMemory("fastlane node-1", 1, None, realtime_threads=0),  # nodes never ask
                     ProcessMemory("fastlane worker-1", 2, None, realtime_threads=1),
                     ProcessMemory("fastlane worker-2", 3, None, realtime_threads=0),
                     ProcessMemory("apscheduler-memory", 4, None, realtime_threads=0),
                     ProcessMemory("apscheduler-sqlalchemy", 5, None, realtime_threads=None)]  # not known
    document = build_document(bench, [], started_at=datetime.now(UTC), elapsed_s=1.0)
    refused = [note.split(" ran with no real-time thread")[0] for note in document["notes"]
               if "ran with no real-time thread" in note]
    assert refused == (["fastlane worker-2", "apscheduler-memory"] if priority else [])
    assert document["realtime_priority"] == priority


def test_out_keeps_the_logs_and_the_workers_records_of_each_run(tmp_path: Path) -> None:
    scratch, out = tmp_path / "scratch", tmp_path / "out" / "logs"
    scratch.mkdir()
    (scratch / "fastlane-node-1.log").write_text("started\n")
    (scratch / "fastlane-received-1.txt").write_text("run-1 1 2 3 job-1 4\n")
    (scratch / "fastlane.db").write_text("not kept: the database")
    _keep_logs(scratch, out)
    assert sorted(path.name for path in out.iterdir()) == ["fastlane-node-1.log", "fastlane-received-1.txt"]
    assert (out / "fastlane-received-1.txt").read_text() == "run-1 1 2 3 job-1 4\n"


def test_the_rebuild_figures_come_from_the_node_log_with_its_jobs_and_runs(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    lines = [
        {"ts": "2026-11-24T23:40:49.000Z", "msg": "database at schema version 13"},
        {"ts": "2026-11-24T23:40:49.071Z", "msg": "acquired 64 shards (tokens 1)"},
        {"ts": "2026-11-24T23:40:49.321Z", "msg": "window rebuilt for 64 shards: 1200 jobs due, 98800 runs pending"},
        {"ts": "2026-11-24T23:40:50.000Z", "msg": "window rebuilt for 1 shards: 5 jobs due, 0 runs pending"},
    ]
    log.write_text("not json\n" + "".join(orjson.dumps(line).decode() + "\n" for line in lines))
    acquired, rebuilt, loaded = scale._rebuild_events(log)
    assert acquired is not None and rebuilt is not None
    assert round((rebuilt - acquired).total_seconds(), 3) == 0.25
    assert loaded == (1200, 98800)  # the first rebuild only
