"""``--repeat N``: one scenario run N times in one invocation, each run shown and the worst of them.

A tail that appears in one run in three is a property of the product, not bad luck: a median of
runs hides it and a best run flatters. So the repeated report puts every run side by side (with
each run's machine-speed reference), and a row of the worst figure of any run, and says for each
target in how many runs it was met.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The lag a result is judged by, first found: start lag (a handler entered), else what the
# scenario measures instead.
LAG_FIGURES = ("start_lag_ms", "delivery_lag_ms", "parent_end_to_child_start_ms")
SHOWN = ("p99", "p999", "max")
LABELS = {"p99": "p99", "p999": "p99.9", "max": "max"}


def lag_of(result: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    for name in LAG_FIGURES:
        figures = result.get(name)
        if isinstance(figures, Mapping) and any(figures.get(key) is not None for key in SHOWN):
            return name, figures
    return None


def systems_of(documents: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every system measured in any run, in the order first seen."""
    seen: dict[str, None] = {}
    for document in documents:
        for result in document.get("results") or ():
            if lag_of(result) is not None:
                seen.setdefault(str(result.get("system")), None)
    return list(seen)


def _result(document: Mapping[str, Any], system: str) -> Mapping[str, Any] | None:
    return next((r for r in document.get("results") or () if r.get("system") == system), None)


def worst(documents: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per system, the largest of each shown figure over the runs (None where no run has it)."""
    figures: dict[str, dict[str, float | None]] = {}
    for system in systems_of(documents):
        values: dict[str, list[float]] = {key: [] for key in SHOWN}
        for document in documents:
            result = _result(document, system)
            found = lag_of(result) if result is not None else None
            if found is None:
                continue
            for key in SHOWN:
                value = found[1].get(key)
                if isinstance(value, int | float):
                    values[key].append(float(value))
        figures[system] = {key: max(found) if found else None for key, found in values.items()}
    return figures


def target_tally(documents: Sequence[Mapping[str, Any]]) -> list[dict[str, object]]:
    """Per target, in order: the status it had in each run."""
    order: dict[str, list[str]] = {}
    for index, document in enumerate(documents):
        for target in document.get("targets") or ():
            statuses = order.setdefault(str(target.get("name")), [""] * len(documents))
            statuses[index] = str(target.get("status"))
    return [{"name": name, "statuses": statuses, "met": statuses.count("MET"),
             "judged": sum(status in ("MET", "MISSED") for status in statuses)} for name, statuses in order.items()]


def repeated_document(documents: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The document of ``--repeat``: every run's own document, the worst figures, the targets per run."""
    first = documents[0]
    return {"scenario": first.get("scenario"), "backend": first.get("backend"), "repeat": len(documents),
            "runs": list(documents), "worst": worst(documents), "targets_by_run": target_tally(documents)}


def render_repeated(document: Mapping[str, Any]) -> str:
    runs: list[Mapping[str, Any]] = document.get("runs") or []
    systems = systems_of(runs)
    count = document.get("repeat")
    lines = [f"# fastlane bench: {document.get('scenario')}, {count} run{'' if count == 1 else 's'}", "",
             f"Backend {document.get('backend')}. Each run is the scenario from scratch (its own database and "
             "processes); the worst row is the largest figure of any run.", ""]
    header = ["run", "speed ref ms"]
    for system in systems:
        header += [f"{system} {LABELS[key]}" for key in SHOWN]
    header.append("targets met")
    lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for index, run in enumerate(runs, start=1):
        cells = [str(index), _text((run.get("machine") or {}).get("speed_reference_ms"))]
        for system in systems:
            result = _result(run, system)
            found = lag_of(result) if result is not None else None
            cells += [_text(found[1].get(key)) if found else "" for key in SHOWN]
        targets = run.get("targets") or []
        cells.append(f"{sum(1 for t in targets if t.get('status') == 'MET')} of "
                     f"{sum(1 for t in targets if t.get('status') in ('MET', 'MISSED'))}")
        lines.append("| " + " | ".join(cells) + " |")
    worst_figures = document.get("worst") or {}
    cells = ["worst", ""]
    for system in systems:
        cells += [_text((worst_figures.get(system) or {}).get(key)) for key in SHOWN]
    cells.append("")
    lines.append("| " + " | ".join(cells) + " |")
    kinds = {lag_of(r)[0] for run in runs for r in run.get("results") or () if lag_of(r) is not None}
    lines += ["", f"Lags in milliseconds ({', '.join(sorted(kinds))})."]
    tally = document.get("targets_by_run") or []
    if tally:
        lines += ["", "## Targets, run by run", "",
                  "| target | " + " | ".join(str(n) for n in range(1, len(runs) + 1)) + " | met in |",
                  "|---|" + "---|" * len(runs) + "---:|"]
        for row in tally:
            statuses = row["statuses"]
            assert isinstance(statuses, list)
            met_in = f"{row['met']} of {row['judged']}" if row["judged"] else "not judged"
            lines.append(f"| {row['name']} | " + " | ".join(statuses) + f" | {met_in} |")
    notes = [f"run {index}: {note}" for index, run in enumerate(runs, start=1) for note in run.get("notes") or ()]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _text(value: object) -> str:
    return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
