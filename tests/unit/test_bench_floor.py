"""The benchmark's cost figures: CPU per run of every process (PostgreSQL's included), the node's
stages from a profile, and the floor the database alone allows."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from fastlane.bench.profile import frame_file, stage_shares
from fastlane.bench.report import render_markdown
from fastlane.bench.scenarios import SCENARIOS
from fastlane.bench.scenarios.floor import compare_with_floor
from fastlane.bench.usage import CpuMeter, Metered, StatLine, cpu_figures, parse_stat, postmaster_pid, tree_ticks

from fastlane.cli.main import main

TICKS = os.sysconf("SC_CLK_TCK")


def stat(pid: int, name: str, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0) -> str:
    """A /proc/PID/stat line as the kernel writes it (52 fields; the rest zero)."""
    rest = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime), str(cutime), str(cstime)] + ["0"] * 35
    return f"{pid} ({name}) {' '.join(rest)}\n"


# -- /proc stat lines -------------------------------------------------------------------------------


def test_a_stat_line_gives_the_parent_and_the_ticks_of_the_process_and_its_reaped_children() -> None:
    assert parse_stat(stat(42, "postgres", 1, 10, 5, 3, 2)) == StatLine(42, 1, 20)


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() -> None:
    line = stat(43, "postgres: bench floor_1 127.0.0.1(5432) idle", 42, 7, 1)
    assert parse_stat(line) == StatLine(43, 42, 8)


@pytest.mark.parametrize("line", ["", "garbage", "12 (x) S"])
def test_a_line_that_does_not_parse_is_none(line: str) -> None:
    assert parse_stat(line) is None


def test_postgres_cpu_is_the_postmaster_and_every_process_below_it_and_nothing_else() -> None:
    stats = {line.pid: line for line in map(parse_stat, [
        stat(100, "postgres", 1, 50, 10, 40, 5),      # the postmaster; 45 from backends that exited
        stat(101, "postgres: checkpointer ", 100, 3, 1),
        stat(102, "postgres: walwriter ", 100, 2, 2),
        stat(103, "postgres: postgres floor_1 127.0.0.1(40000) idle", 100, 30, 6),
        stat(104, "postgres: parallel worker for PID 103", 103, 4, 0),  # a grandchild
        stat(200, "python", 1, 900, 90),              # the node: not PostgreSQL's
        stat(201, "python", 200, 9, 1),               # ...nor its child
    ]) if line is not None}
    assert tree_ticks(100, stats) == 105 + 4 + 4 + 36 + 4
    assert tree_ticks(999, stats) is None


def test_the_postmaster_pid_is_the_first_line_of_its_pid_file(tmp_path: Path) -> None:
    (tmp_path / "postmaster.pid").write_text("4242\n/var/lib/data\n1700000000\n5432\n")
    assert postmaster_pid(tmp_path) == 4242
    assert postmaster_pid(tmp_path / "nowhere") is None


def _write_proc(proc: Path, lines: dict[int, str]) -> None:
    for pid, line in lines.items():
        (proc / str(pid)).mkdir(exist_ok=True)
        (proc / str(pid) / "stat").write_text(line)


def test_the_meter_reports_each_process_over_the_interval_and_per_run(tmp_path: Path) -> None:
    _write_proc(tmp_path, {10: stat(10, "python", 1, TICKS, 0), 20: stat(20, "python", 1, 0, 0),
                           30: stat(30, "postgres", 1, TICKS, 0), 31: stat(31, "postgres: idle", 30, 0, 0)})
    meter = CpuMeter([Metered("node-1", "node", 10), Metered("worker-1", "worker", 20),
                      Metered("postgres", "postgres", 30, tree=True), Metered("harness", "harness", 10)], proc=tmp_path)
    meter.start()
    # Over the interval: the node 2 s, the worker 1 s, PostgreSQL 0.5 s + a backend's 0.5 s.
    _write_proc(tmp_path, {10: stat(10, "python", 1, 2 * TICKS, TICKS), 20: stat(20, "python", 1, 0, TICKS),
                           30: stat(30, "postgres", 1, TICKS, 0, TICKS // 2),
                           31: stat(31, "postgres: idle", 30, TICKS // 2, 0)})
    figures = meter.stop(runs=1_000)
    rows = {row["name"]: row for row in figures["processes"]}  # type: ignore[attr-defined]
    assert rows["node-1"]["cpu_s"] == 2.0
    assert rows["node-1"]["us_per_run"] == 2_000.0
    assert rows["worker-1"]["cpu_s"] == 1.0
    assert rows["postgres"]["cpu_s"] == 1.0
    assert rows["total"]["cpu_s"] == 4.0  # nodes, workers and PostgreSQL: not the harness
    assert rows["total"]["us_per_run"] == 4_000.0
    assert figures["runs"] == 1_000


def test_a_process_gone_before_the_end_leaves_its_line_and_the_total_unknown() -> None:
    processes = [Metered("node-1", "node", 10), Metered("node-2", "node", 11), Metered("worker-1", "worker", 20)]
    figures = cpu_figures(processes, {"node-1": 1.0, "node-2": None, "worker-1": 0.5}, runs=100, interval_s=2.0)
    rows = {row["name"]: row for row in figures["processes"]}  # type: ignore[attr-defined]
    assert rows["node-2"]["cpu_s"] is None
    assert rows["nodes"]["cpu_s"] is None
    assert rows["total"]["cpu_s"] is None
    assert rows["worker-1"]["cores"] == 0.25


# -- stages from a profile ------------------------------------------------------------------------


def test_a_frame_names_its_file_with_or_without_a_line_number() -> None:
    assert frame_file("_write (/src/fastlane/engine/dispatch/journal.py:244)") == "/src/fastlane/engine/dispatch/journal.py"
    assert frame_file("_write (/src/fastlane/engine/dispatch/journal.py)") == "/src/fastlane/engine/dispatch/journal.py"


def test_stage_shares_count_each_stack_in_every_stage_it_passes_through() -> None:
    root = "run (/usr/lib/python3.11/asyncio/runners.py)"
    lines = [
        f"{root};_write (/x/fastlane/engine/dispatch/journal.py);fetch (/x/fastlane/storage/postgres/tx.py) 30",
        f"{root};_materialise (/x/fastlane/engine/write_ahead.py) 20",
        f"{root};Stream (/x/fastlane/server/servicers/workers.py);read (/venv/grpc/aio/_call.py) 25",
        f"{root};_pump (/x/fastlane/engine/dispatch/dispatcher.py) 15",
        f"{root};collect (/venv/prometheus_client/registry.py) 5",
        f"serve (/x/fastlane/server/node.py);{root};Runner.run (/usr/lib/python3.11/asyncio/runners.py) 3",
        "_bootstrap (/usr/lib/python3.11/threading.py);_watch (/x/fastlane/runtime/stalls.py);"
        "Condition.wait (/usr/lib/python3.11/threading.py) 2",
        "not a stack line",
    ]
    figures = stage_shares(lines)
    assert figures["samples"] == 100
    assert figures["stages"] == {"write-ahead": 0.2, "release": 0.0, "dispatch": 0.15, "journal": 0.3,
                                 "stream": 0.25, "database": 0.3, "event loop (compiled code or poll)": 0.03,
                                 "threads waiting": 0.02, "other": 0.05}


def test_no_samples_give_no_shares() -> None:
    assert stage_shares([])["stages"]["journal"] is None  # type: ignore[index]


# -- the report --------------------------------------------------------------------------------------


def test_fastlane_is_compared_with_the_floor_measured_in_the_same_run() -> None:
    result: dict[str, object] = {"system": "fastlane", "runs_per_s": 2_500.0}
    compare_with_floor(result, {"system": "floor", "runs_per_s": 10_000.0})
    assert (result["floor_runs_per_s"], result["vs_floor"]) == (10_000.0, 0.25)
    assert result["floor_cpu_share"] is None  # neither measured its CPU
    cpu = cpu_figures([Metered("node-1", "node", 1)], {"node-1": 0.4}, runs=1_000, interval_s=1.0)
    floor_cpu = cpu_figures([Metered("postgres", "postgres", 2, tree=True)], {"postgres": 0.1}, runs=1_000,
                            interval_s=0.1)
    measured: dict[str, object] = {"system": "fastlane", "runs_per_s": 1_000.0, "cpu": cpu}
    compare_with_floor(measured, {"system": "floor", "runs_per_s": 4_000.0, "cpu": floor_cpu})
    assert measured["floor_cpu_share"] == 0.25  # 100 µs of the database alone in 400 µs a run
    alone: dict[str, object] = {"system": "fastlane", "runs_per_s": 2_500.0}
    compare_with_floor(alone, None)
    assert "vs_floor" not in alone


def test_the_report_shows_cpu_per_run_the_stages_and_the_floor() -> None:
    cpu = cpu_figures([Metered("node-1", "node", 1), Metered("postgres", "postgres", 2, tree=True)],
                      {"node-1": 3.0, "postgres": 6.0}, runs=30_000, interval_s=5.0)
    document = {"scenario": "sustained", "backend": "postgres", "results": [
        {"system": "fastlane", "jobs": 100, "runs_per_s": 6_000.0, "floor_runs_per_s": 12_000.0, "vs_floor": 0.5,
         "cpu": cpu, "profile": {"process": "node-1", "file": "fastlane-node-1-profile.txt", "rate_hz": 100,
                                 "samples": 400, "stages": {"journal": 0.25, "other": 0.1}}},
        {"system": "floor", "jobs": 100, "runs_per_s": 12_000.0, "driver": "asyncpg 0.32.0",
         "materialise_batch": 2_000, "journal_batch": 1_000},
    ]}
    text = render_markdown(document)
    assert "## CPU per succeeded run: fastlane" in text
    assert "| **total** | 9 | 1.80 | 300 |" in text
    assert "| postgres | 6 | 1.20 | 200 |" in text
    assert "| journal | 25.0 % |" in text
    assert "| runs/s ÷ the floor's | 0.5 |" in text
    assert "asyncpg 0.32.0" in text


def test_the_floor_is_registered_and_only_the_scenarios_that_meter_cpu_take_floor_and_profile(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert "floor" in SCENARIOS
    assert main(["bench", "spread", "--floor"]) == 2
    assert "--floor applies to sustained and burst" in capsys.readouterr().err
    assert main(["bench", "cron", "--profile"]) == 2
    assert "--profile applies to sustained, burst and spread" in capsys.readouterr().err
    assert main(["bench", "floor", "--nodes", "2", "--backend", "postgres"]) == 2


def test_a_tiny_floor_on_sqlite_reports_a_positive_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["bench", "floor", "--backend", "sqlite", "--scale", "0.01", "--json", "--out", str(out)]) == 0
    document = orjson.loads(capsys.readouterr().out)
    (floor,) = document["results"]
    assert floor["system"] == "floor"
    assert floor["jobs"] == floor["runs"] == 200
    assert floor["runs_per_s"] > 0
    assert floor["materialise_batch"] == 2_000 and floor["journal_batch"] == 1_000
    assert floor["driver"].startswith("sqlite3")
    rows = {row["name"]: row for row in floor["cpu"]["processes"]}
    assert rows["total"]["cpu_s"] is not None  # the driver runs SQLite in the harness itself
    assert (out / "result.md").read_text().startswith("# fastlane bench: floor")
