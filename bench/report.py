"""Turning a result document into what people read: JSON, a Markdown report, a lag plot.

The document is a plain dict (it is what ``--json`` prints); everything here only reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from fastlane.bench.stats import LAG_KEYS, LAG_KINDS, LAG_LABELS

MIB = 1 << 20

# Scenario figures worth a line of their own, in this order, with their unit.
_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("tenant", "tenant", ""),
    ("priority", "priority", ""),
    ("phase", "phase", ""),
    ("offered_runs_per_s", "offered load", "runs/s"),
    ("started", "runs started", ""),
    ("worker_processes", "worker processes", ""),
    ("worker_concurrency", "runs at once per worker process and node", ""),
    ("handler_ms", "handler time", "ms"),
    ("handler_jitter", "handler time varies by (fraction, either way)", ""),
    ("capacity_runs_per_s", "capacity (slots x 1000 / handler ms)", "runs/s"),
    ("phase_s", "each phase", "s"),
    ("noisy_in_flight_cap", "noisy tenant's cap in flight per node", ""),
    ("overload_s", "overload lasted", "s"),
    ("times_capacity", "offered load during it, x capacity", ""),
    ("total_offered_runs_per_s", "offered load, all classes", "runs/s"),
    ("high_ahead_for_s", "high runs go first while a low one has waited less than", "s"),
    ("aging_bound_s", "aging bound", "s"),
    ("nodes", "nodes", ""),
    ("concurrency_key", "concurrency key", ""),
    ("concurrency_limit", "its limit", "runs"),
    ("most_running_at_once", "most of its runs running at once (workers' records)", "runs"),
    ("runs_ended", "runs ended", ""),
    ("first_start_to_last_end_s", "first start to last end", "s"),
    ("best_runs_per_s", "best rate the limit allows", "runs/s"),
    ("drained_after_s", "last run started after offering stopped", "s"),
    ("window_s", "measured over", "s"),
    ("succeeded_in_window", "runs succeeded in the window (metrics)", ""),
    ("due_in_window", "runs due in the window", ""),
    ("delivered_in_window", "of those, received by the workers", ""),
    ("missed_in_window", "occurrences missed (skipped by misfire policy) in the window", ""),
    ("last_delivery_after_instant_s", "last delivery after the instant", "s"),
    ("window_jobs", "jobs due in the window", ""),
    ("jobs_in_window", "jobs the node held in its window, planned or written (metrics)", ""),
    ("stored_jobs", "jobs stored", ""),
    ("stored_runs", "runs stored", ""),
    ("heavy_job_runs", "runs of the job whose pages are fetched", ""),
    ("load_s", "time to load the jobs and runs", "s"),
    ("requests_per_page", "timed requests per page, after warm-ups", ""),
    ("token_role", "signed in with a token of role", ""),
    ("rss_before_bytes", "daemon RSS before loading the window", "bytes"),
    ("rss_after_bytes", "daemon RSS after loading the window", "bytes"),
    ("bytes_per_window_job", "memory per in-window job", "bytes"),
    ("rebuild_s", "rebuild: daemon start to SERVING", "s"),
    ("rebuild_log_s", "rebuild: shards acquired to 'window rebuilt' (log)", "s"),
    ("rebuild_jobs", "jobs in the rebuilt window (log)", ""),
    ("rebuild_runs", "runs written ahead, loaded by the rebuild (log)", ""),
    ("rss_due_runs_bytes", "RSS of the rebuilt node once every run waits in its ready queue", "bytes"),
    ("bytes_per_due_run", "memory per run written and waiting (no worker), over the RSS at rest", "bytes"),
    ("cron", "cron expression", ""),
    ("firings", "firings measured", ""),
    ("expected", "runs expected", ""),
    ("lease_ttl_s", "shard lease TTL", "s"),
    ("killed_node", "node killed", ""),
    ("killed_shards", "shards of the killed node", ""),
    ("failover_gap_s", "failover gap (worst lateness on its shards)", "s"),
    ("first_delivery_after_kill_s", "first run of its shards delivered after the kill", "s"),
    ("victim_delivery_lag_ms", "delivery lag on its shards since the kill (p50 / p99 / max)", "ms"),
    ("missing_occurrences", "occurrences never delivered", ""),
    ("floor_runs_per_s", "floor: runs/s the database alone allows (same run, bench floor)", "runs/s"),
    ("vs_floor", "runs/s ÷ the floor's", ""),
    ("floor_cpu_share", "the floor's CPU per run ÷ this run's (total of every process)", ""),
    ("driver", "database driver (floor)", ""),
    ("runs", "runs through all three writes", ""),
    ("materialise_batch", "materialisation batch (occurrences, the node's largest)", ""),
    ("journal_batch", "dispatch and result batch (runs, a bench worker's credits)", ""),
    ("floor_elapsed_s", "first materialisation to last result", "s"),
    ("materialise_s", "in materialisation transactions", "s"),
    ("dispatch_s", "in dispatch statements", "s"),
    ("result_s", "in result transactions", "s"),
    ("due_jobs_read_s", "reading the due jobs (not in the rate)", "s"),
    ("insert_s", "time to create the jobs", "s"),
    ("lead_in_overrun_s", "lead-in overrun (runs due before everything was up)", "s"),
    ("late_starts", "runs started 1 ms or more late", ""),
    ("late_starts_waiting_for_cpu", "of those, the worker's loop thread waited for a CPU half as long or more", ""),
    ("worker_cpu_wait_ms", "worker loop thread's wait for a CPU between starts (p50 / p99 / max)", "ms"),
    ("hours", "soak: hours", "h"),
    ("slice_s", "each slice", "s"),
    ("faults", "faults (worker killed, PostgreSQL restarted)", ""),
    ("occurrences_expected", "occurrences due before the load stopped", ""),
    ("lost", "of those, never run", ""),
    ("twice", "run by two runs or more", ""),
    ("started_again_after_a_kill", "handlers entered again for one run after its worker was killed", ""),
    ("one_shots", "one-shot jobs created through the API", ""),
    ("workflow_runs", "workflow runs triggered", ""),
    ("workflow_steps_lost", "workflow steps never ended", ""),
    ("workflow_steps_twice", "workflow steps started twice", ""),
    ("calls_retried", "API calls retried while the database was away", ""),
    ("start_lag_drift", "start-lag p99 outside faults, last slice / first", ""),
    ("rss_slope_mib_per_h", "node's RSS over the second half, least-squares slope", "MiB/h"),
    ("node_peak_rss_bytes", "node's peak RSS", "bytes"),
    ("stall_causes", "node's event-loop stalls by cause", ""),
)
_SLICE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("slice", "slice"), ("from_s", "from s"), ("rss_bytes", "RSS"), ("open_files", "files"),
    ("threads", "threads"), ("db_connections", "db conns"), ("open_files_in_faults", "files in faults"),
    ("db_connections_in_faults", "db conns in faults"), ("loop_lag_p99_ms", "loop p99 ms"),
    ("loop_lag_p999_ms", "loop p99.9 ms"), ("runs_due", "runs due"), ("start_lag_p99_ms", "start p99 ms"),
    ("start_lag_max_ms", "start max ms"), ("steady_start_lag_p99_ms", "start p99 ms, no fault"),
    ("history_trimmed", "history trimmed"),
)


def to_json(document: Mapping[str, Any]) -> str:
    """The document as indented JSON (infinities and NaN become null)."""
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def render_markdown(document: Mapping[str, Any]) -> str:
    """The whole report: results, ratios to the peer, targets, scenario figures, processes, notes."""
    lines = [f"# fastlane bench: {document.get('scenario')}", ""]
    lines.append(
        f"Backend {document.get('backend')}, {document.get('nodes', 1)} node(s), "
        f"scale {_number(document.get('scale'))}"
        + (f", {document['elapsed_s']:.0f} s" if isinstance(document.get("elapsed_s"), int | float) else "")
        + "."
    )
    if document.get("job_creation"):
        lines.append(f"Jobs created: {document['job_creation']}.")
    machine = document.get("machine") or {}
    if machine:
        lines.append(f"Machine: {', '.join(f'{key} {value}' for key, value in machine.items())}.")
    priority = document.get("realtime_priority")
    if priority is not None:
        lines.append("Threads that start runs (fastlane's workers' event loops, the peer's scheduler): "
                     + (f"real-time scheduling, SCHED_FIFO priority {priority}; the processes table says where "
                        "it was granted." if priority else "normal scheduling."))
    postgres = document.get("postgres") or {}
    if postgres:
        lines.append(f"PostgreSQL: {', '.join(f'{key} {value}' for key, value in postgres.items())}.")
    lines.append("")
    results = document.get("results") or []
    # Pages fetched (console) have times, not lags: a table of their own instead of the lags'.
    if any("pages" in result for result in results):
        lines += _pages_table(results)
    elif any("slices" in result for result in results):
        lines += _slices_table(results)
    else:
        lines += _results_table(results)
    ratios = document.get("ratios") or {}
    if ratios:
        lines += ["", "## fastlane : APScheduler (below 1: fastlane is faster)", ""]
        lines += _ratios_table(ratios)
    figures = _figure_rows(document.get("results") or [])
    if figures:
        lines += ["", "## Scenario figures", ""] + figures
    lines += _cpu_tables(document.get("results") or [])
    lines += _profile_tables(document.get("results") or [])
    targets = document.get("targets") or []
    if targets:
        lines += ["", "## Targets", ""] + _targets_table(targets)
    processes = document.get("processes") or []
    if processes:
        lines += ["", "## Processes: peak RSS (VmHWM), CPU time, threads under real-time scheduling", "",
                  "| process | pid | peak RSS | CPU s | real-time threads |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {p['name']} | {p.get('pid') or ''} | {_bytes(p.get('peak_rss_bytes'))} | "
                  f"{_blank_if_none(p.get('cpu_s'))} | {_blank_if_none(p.get('realtime_threads'))} |"
                  for p in processes]
    notes = document.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _blank_if_none(value: object) -> str:
    return "" if value is None else str(value)


def _lag_label(kind: str) -> str:
    return kind.removesuffix("_lag_ms")  # start_lag_ms: start


def _results_table(results: Sequence[Mapping[str, Any]]) -> list[str]:
    lag_headers = [f"{_lag_label(kind)} {LAG_LABELS[key]}" for kind in LAG_KINDS for key in LAG_KEYS]
    header = ["system", "jobs", "delivered", "duplicates", *lag_headers, "runs/s"]
    rows = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for result in results:
        cells = [str(result.get("system")), _count(result.get("jobs")), _count(result.get("delivered")),
                 _count(result.get("duplicates"))]
        for kind in LAG_KINDS:
            figures = result.get(kind) or {}
            cells += [_ms(figures.get(key)) for key in LAG_KEYS]
        cells.append(_number(result.get("runs_per_s")))
        rows.append("| " + " | ".join(cells) + " |")
    rows.append("")
    rows.append("Lags in milliseconds from the scheduled instant: start = handler entered (for APScheduler, the job "
                "function called), delivery = worker received, release = node released.")
    return rows


def _pages_table(results: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = ["| page | path | p50 ms | p95 ms | max ms | bytes |", "|---|---|---:|---:|---:|---:|"]
    for result in results:
        for page in result.get("pages") or ():
            figures = page.get("ms") or {}
            rows.append(f"| {page.get('page')} | `{page.get('path')}` | "
                        + " | ".join(_ms(figures.get(key)) for key in ("p50", "p95", "max"))
                        + f" | {_count(page.get('bytes'))} |")
    rows += ["", "Times in milliseconds from sending the request to reading the answer's last byte."]
    return rows


def _slices_table(results: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = ["| " + " | ".join(label for _, label in _SLICE_COLUMNS) + " |", "|" + "---:|" * len(_SLICE_COLUMNS)]
    for result in results:
        for row in result.get("slices") or ():
            cells = [_bytes(row.get(key)) if key == "rss_bytes" else _blank_if_none(row.get(key))
                     for key, _ in _SLICE_COLUMNS]
            rows.append("| " + " | ".join(cells) + " |")
    rows += ["", "Per slice: the node's largest RSS, open files, threads and database connections (PostgreSQL "
             "sessions; on SQLite, its open database files) of the samples taken in it; its event-loop lag "
             "(bucket bounds); the start lag (handler entered − scheduled) of the runs due in it, and its p99 "
             "without the runs due while a fault was recovered from."]
    return rows


def _ratios_table(ratios: Mapping[str, Mapping[str, Mapping[str, float | None]]]) -> list[str]:
    peers = list(ratios)
    rows = ["| lag | " + " | ".join(f"vs {peer}" for peer in peers) + " |", "|---|" + "---:|" * len(peers)]
    for kind in LAG_KINDS:
        label = _lag_label(kind)
        for key in LAG_KEYS:
            cells = [_number(ratios[peer].get(kind, {}).get(key)) for peer in peers]
            rows.append(f"| {label} {LAG_LABELS[key]} | " + " | ".join(cells) + " |")
    return rows


def _targets_table(targets: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = ["| target | measured | limit | status | note |", "|---|---:|---:|---|---|"]
    for target in targets:
        unit = target.get("unit", "")
        measured = target.get("measured")
        shown = "—" if measured is None else f"{_number(measured)} {unit}".strip()
        if measured is None and target.get("status") == "MISSED":
            shown = "never"  # runs not delivered at all: infinitely late
        limit = f"{target.get('op', '')} {_number(target.get('limit'))} {unit}".strip()
        rows.append(f"| {target.get('name')} | {shown} | {limit} | {target.get('status')} | {target.get('note', '')} |")
    return rows


def _figure_rows(results: Sequence[Mapping[str, Any]]) -> list[str]:
    shown = [(key, label, unit) for key, label, unit in _FIGURES if any(key in result for result in results)]
    if not shown:
        return []
    systems = [str(result.get("system")) for result in results]
    rows = ["| figure | " + " | ".join(systems) + " |", "|---|" + "---:|" * len(systems)]
    for key, label, unit in shown:
        cells = []
        for result in results:
            value = result.get(key)
            if value is None:
                cells.append("")
            elif unit == "bytes" and key.endswith("_bytes"):
                cells.append(_bytes(value))
            elif isinstance(value, Mapping) and "p99" not in value:  # counts by name
                cells.append(", ".join(f"{name} {_number(count)}" for name, count in value.items()) or "none")
            elif isinstance(value, Mapping):
                cells.append(" / ".join(_ms(value.get(key)) or "—" for key in ("p50", "p99", "max")) + f" {unit}")
            else:
                cells.append(f"{_number(value)} {unit}".strip() if isinstance(value, int | float) else str(value))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def _cpu_tables(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per result measured so: each process's CPU over the measured interval, and per run."""
    lines: list[str] = []
    for result in results:
        cpu = result.get("cpu")
        if not isinstance(cpu, Mapping):
            continue
        lines += ["", f"## CPU per succeeded run: {result.get('system')}", "",
                  f"Over {_number(cpu.get('interval_s'))} s and {_count(cpu.get('runs'))} runs succeeded in it "
                  "(user + system, every thread; PostgreSQL: the postmaster and all its processes; "
                  "cores = CPU s ÷ the interval).", "",
                  "| process | CPU s | cores | µs per run |", "|---|---:|---:|---:|"]
        for row in cpu.get("processes") or ():
            name = f"**{row.get('name')}**" if row.get("role") == "total" else str(row.get("name"))
            lines.append(f"| {name} | {_number(row.get('cpu_s'))} | {_number(row.get('cores'))} | "
                         f"{_number(row.get('us_per_run'))} |")
    return lines


def _profile_tables(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per result profiled (``--profile``): the share of the node's samples in each stage."""
    lines: list[str] = []
    for result in results:
        profile = result.get("profile")
        if not isinstance(profile, Mapping):
            continue
        lines += ["", f"## Where {profile.get('process')} spent its CPU (py-spy): {result.get('system')}", ""]
        if profile.get("error"):
            lines.append(f"No profile: {profile['error']}.")
            continue
        lines += [f"{_count(profile.get('samples'))} samples at {profile.get('rate_hz')} a second of threads at "
                  f"work, in `{profile.get('file')}` (logs/ with --out). A stack can pass through two stages "
                  "(the journal calling the store): shares overlap.", "",
                  "| stage | share of samples |", "|---|---:|"]
        stages = profile.get("stages") or {}
        lines += [f"| {stage} | {_share(share)} |" for stage, share in stages.items()]
    return lines


def _share(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{value * 100:.1f} %"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else ("" if value is None else str(value))


def _ms(value: Any) -> str:
    return "" if value is None else f"{value:,.3f}" if value < 10 else f"{value:,.1f}"


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _bytes(value: Any) -> str:
    if not isinstance(value, int | float):
        return ""
    return f"{value / MIB:,.1f} MiB" if value >= MIB else f"{value:,.0f} B"


def write_outputs(document: Mapping[str, Any], out_dir: Path, samples: Mapping[str, Sequence[float]]) -> list[Path]:
    """result.json, result.md and, when matplotlib is installed and there are samples, lag.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "result.json", out_dir / "result.md"]
    written[0].write_text(to_json(document) + "\n")
    written[1].write_text(render_markdown(document))
    plot = plot_lags(samples, out_dir / "lag.png", title=f"{document.get('scenario')} ({document.get('backend')})")
    if plot is not None:
        written.append(plot)
    return written


def plot_lags(samples: Mapping[str, Sequence[float]], path: Path, *, title: str) -> Path | None:
    """The cumulative distribution of delivery lag (and start lag, a series named "… (start)") per
    system, log scale; None without matplotlib (or with no samples)."""
    series = {name: sorted(values) for name, values in samples.items() if values}
    if not series:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for name, values in series.items():
        count = len(values)
        # Positive values only on a log axis; a lag below 1 µs is drawn at 1 µs.
        axes.plot([max(value, 0.001) for value in values], [(index + 1) / count for index in range(count)], label=name)
    axes.set_xscale("log")
    axes.set_xlabel("delivery or start lag (ms, log scale)")
    axes.set_ylabel("fraction of runs")
    axes.set_title(f"Lag distribution: {title}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
