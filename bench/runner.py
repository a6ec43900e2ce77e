"""Running one scenario end to end: set up, measure within a hard deadline, tear down, report.

Teardown never depends on the scenario finishing: processes are stopped by the context managers
they were started in, the PostgreSQL cluster by its own, on success, error, timeout, Ctrl-C
(SIGINT) and SIGTERM alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from fastlane.bench.harness import JOB_CREATION, SCENARIOS_THROUGH_API, THROUGH_API, Bench, BenchTimeout, Progress
from fastlane.bench.pgcluster import DURABLE_SETTINGS, ThrowawayPostgres
from fastlane.bench.repeat import render_repeated, repeated_document
from fastlane.bench.report import render_markdown, to_json, write_outputs
from fastlane.bench.scenarios import SCENARIOS, Scenario
from fastlane.bench.scenarios.floor import SYSTEM as FLOOR_SYSTEM
from fastlane.bench.stats import lag_ratios
from fastlane.bench.targets import as_json, evaluate, result_of
from fastlane.bench.usage import harness_memory

from fastlane.errors import FastlaneError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    scenario: str
    backend: str = "sqlite"
    nodes: int = 1
    workers: int = 1
    scale: float = 1.0
    peer: bool = True  # run APScheduler beside fastlane where the scenario has a peer
    secure: bool = False  # spread and burst: fastlane again with TLS and an API token
    durable: bool = False  # postgres: the throwaway server with fsync and synchronous commits
    realtime_priority: int = 1  # of the threads that start runs, fastlane's and the peer's; 0: normal
    floor: bool = False  # sustained and burst: the database's floor first, and fastlane's runs/s as a ratio to it
    profile: bool = False  # sustained and burst: py-spy on node-1 over the measured interval
    hours: float | None = None  # soak: how long (None: its quick default)
    repeat: int = 1  # runs of the scenario, each from scratch, reported side by side
    json: bool = False
    out: str | None = None


def run_benchmark(options: Options) -> int:
    """Run the scenario (``repeat`` times), print the report (Markdown, or JSON with ``json``), write ``out``."""
    out = Path(options.out) if options.out else None
    if options.repeat == 1:
        document = _measure_once(options, out, Progress())
        if isinstance(document, int):
            return document
        print(to_json(document) if options.json else render_markdown(document))
        return EXIT_OK
    documents: list[dict[str, Any]] = []
    failed: int | None = None
    for index in range(1, options.repeat + 1):
        print(f"run {index} of {options.repeat}", file=sys.stderr)
        document = _measure_once(options, out / f"run-{index}" if out else None, Progress())
        if isinstance(document, int):
            failed = document  # a run that failed ends the series (its error says why); the runs done are reported
            break
        documents.append(document)
    if not documents:
        return failed if failed is not None else EXIT_FAILED
    repeated = repeated_document(documents)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(to_json(repeated) + "\n")
        (out / "result.md").write_text(render_repeated(repeated))
        print(f"wrote {out / 'result.json'}, {out / 'result.md'}", file=sys.stderr)
    print(to_json(repeated) if options.json else render_repeated(repeated))
    return EXIT_OK if failed is None else failed


def _measure_once(options: Options, out: Path | None, progress: Progress) -> dict[str, Any] | int:
    """One run of the scenario: its document (written to ``out``), or the exit code it failed with."""
    scenario = SCENARIOS[options.scenario]
    started_at = datetime.now(UTC)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fastlane-bench-") as scratch:
        bench = Bench(scenario=options.scenario, backend=options.backend, nodes=options.nodes,
                      workers=options.workers, scale=options.scale, peer=options.peer, secure=options.secure,
                      durable=options.durable, realtime_priority=options.realtime_priority,
                      floor=options.floor, profile=options.profile, hours=options.hours, workdir=Path(scratch),
                      progress=progress)
        try:
            results = _run(scenario, bench)
        except KeyboardInterrupt:
            progress.end()
            print("interrupted: everything started was stopped", file=sys.stderr)
            return EXIT_INTERRUPTED
        except (BenchTimeout, RuntimeError, OSError, FastlaneError) as error:
            progress.end()
            print(f"error: the {options.scenario} run failed: {error}", file=sys.stderr)
            return EXIT_FAILED
        finally:
            progress.end()
            if out is not None:
                _keep_logs(bench.workdir, out / "logs")
    document = build_document(bench, results, started_at=started_at, elapsed_s=time.monotonic() - started)
    if out is not None:
        written = write_outputs(document, out, bench.samples)
        print(f"wrote {', '.join(str(path) for path in written)}", file=sys.stderr)
    return document


def _run(scenario: Scenario, bench: Bench) -> list[dict[str, object]]:
    with contextlib.ExitStack() as stack:
        if bench.backend == "postgres":
            bench.progress.phase("starting a throwaway PostgreSQL")
            bench.pg = stack.enter_context(ThrowawayPostgres(settings=DURABLE_SETTINGS if bench.durable else None))
        try:
            import uvloop
        except ImportError:
            return asyncio.run(_bounded(scenario, bench))
        return uvloop.run(_bounded(scenario, bench))


async def _bounded(scenario: Scenario, bench: Bench) -> list[dict[str, object]]:
    """The scenario under its hard deadline; SIGTERM cancels it like Ctrl-C does."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    budget = scenario.budget(bench)
    deadline = asyncio.timeout(budget)
    try:
        async with deadline:
            return await scenario.measure(bench)
    except TimeoutError:
        if deadline.expired():
            raise BenchTimeout(f"it ran past its hard deadline of {budget:.0f} s") from None
        raise
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGTERM)


def build_document(bench: Bench, results: list[dict[str, object]], *, started_at: datetime,
                   elapsed_s: float) -> dict[str, Any]:
    """The result document: what ``--json`` prints and result.json holds."""
    document: dict[str, Any] = {
        "scenario": bench.scenario,
        "backend": bench.backend,
        "nodes": bench.nodes,
        "workers": bench.workers,
        "scale": bench.scale,
        "started_at": started_at.isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed_s, 1),
        "job_creation": THROUGH_API if bench.scenario in SCENARIOS_THROUGH_API else JOB_CREATION,
        "machine": machine(),
        "realtime_priority": bench.realtime_priority,
        "results": results,
    }
    if bench.pg is not None:
        document["postgres"] = bench.pg.durability
    fastlane = result_of(document, "fastlane")
    peers = [result for result in results if result.get("system") not in ("fastlane", FLOOR_SYSTEM)]
    if fastlane is not None and peers:
        document["ratios"] = {str(peer["system"]): lag_ratios(fastlane, peer) for peer in peers}
    document["targets"] = as_json(evaluate(document))
    document["processes"] = [memory.as_json() for memory in (*bench.memory, harness_memory())]
    document["notes"] = list(bench.notes) + realtime_refusals(bench)
    return document


def realtime_refusals(bench: Bench) -> list[str]:
    """Notes for the processes that should have started runs from a real-time thread and did not
    (the privilege refused, or a worker's runaway guard lowered it: its log says which)."""
    if not bench.realtime_priority:
        return []
    return [f"{memory.name} ran with no real-time thread, though --realtime-priority {bench.realtime_priority} "
            "asked for one: its starts waited for a core as under normal scheduling"
            for memory in bench.memory
            if memory.realtime_threads == 0 and ("worker" in memory.name or memory.name.startswith("apscheduler"))]


def speed_reference_ms(rounds: int = 5) -> float:
    """The median time of a fixed pure-Python loop, in ms: how fast this machine runs Python now.

    Machines of one kind differ about threefold, and one machine differs from hour to hour, so a
    figure is judged next to this reference (or as a ratio to a peer measured in the same run).
    """
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i * i % 7
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def machine() -> dict[str, object]:
    """What the numbers were measured on."""
    description: dict[str, object] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                                      "speed_reference_ms": speed_reference_ms()}
    with contextlib.suppress(OSError):
        description["load_average"] = round(os.getloadavg()[0], 2)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                description["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                description["memory"] = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break
    for package in ("fastlane", "apscheduler"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            description[package] = metadata.version(package)
    return description


def _keep_logs(workdir: Path, target: Path) -> None:
    """Copy the processes' logs, the workers' records of what they received (one line per run:
    ``bench/lag_worker.py`` says what each field is) and the profiles of ``--profile`` to ``target``:
    to find which runs were late, and why, after the scratch directory is gone."""
    found = [*workdir.glob("*.log"), *workdir.glob("*-received-*.txt"), *workdir.glob("*-profile.txt")]
    logs = sorted(path for path in found if path.is_file())
    if not logs:
        return
    target.mkdir(parents=True, exist_ok=True)
    for path in logs:
        with contextlib.suppress(OSError):
            shutil.copyfile(path, target / path.name)
