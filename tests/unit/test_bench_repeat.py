"""``--repeat``: every run side by side, the worst of them, each target's status run by run."""

from __future__ import annotations

from fastlane.bench.repeat import render_repeated, repeated_document, target_tally, worst


def run(p99: float, p999: float, top: float, *, peer_p99: float | None = None, met: bool = True,
        speed: float = 50.0) -> dict[str, object]:
    results: list[dict[str, object]] = [
        {"system": "fastlane", "start_lag_ms": {"p50": 0.1, "p99": p99, "p999": p999, "max": top}}]
    if peer_p99 is not None:
        results.append({"system": "apscheduler-memory", "start_lag_ms": {"p99": peer_p99, "p999": None, "max": 9.0}})
    return {"scenario": "spread", "backend": "sqlite", "machine": {"speed_reference_ms": speed}, "results": results,
            "targets": [{"name": "spread p99 vs peer", "status": "MET" if met else "MISSED"},
                        {"name": "secured", "status": "N/A"}],
            "notes": ["a note"]}


def test_the_worst_row_is_the_largest_figure_of_any_run_per_system() -> None:
    runs = [run(0.3, 2.0, 9.0, peer_p99=0.6), run(10.5, 1.5, 96.7, peer_p99=0.7), run(0.2, 18.4, 44.5)]
    assert worst(runs) == {"fastlane": {"p99": 10.5, "p999": 18.4, "max": 96.7},
                           "apscheduler-memory": {"p99": 0.7, "p999": None, "max": 9.0}}


def test_each_target_is_tallied_run_by_run() -> None:
    tally = target_tally([run(0.3, 2.0, 9.0), run(10.5, 67.8, 96.7, met=False), run(0.2, 18.4, 44.5)])
    assert tally[0] == {"name": "spread p99 vs peer", "statuses": ["MET", "MISSED", "MET"], "met": 2, "judged": 3}
    assert (tally[1]["met"], tally[1]["judged"]) == (0, 0)  # never applicable: judged in none


def test_the_repeated_report_shows_every_run_the_worst_and_the_targets() -> None:
    document = repeated_document([run(0.3, 2.0, 9.0, peer_p99=0.6, speed=47.2),
                                  run(10.5, 67.8, 96.7, peer_p99=0.7, met=False)])
    text = render_repeated(document)
    assert text.startswith("# fastlane bench: spread, 2 runs")
    assert "| 1 | 47.2 | 0.3 | 2 | 9 | 0.6 |  | 9 | 1 of 1 |" in text
    assert "| 2 | 50 | 10.5 | 67.8 | 96.7 | 0.7 |  | 9 | 0 of 1 |" in text
    assert "| worst |  | 10.5 | 67.8 | 96.7 | 0.7 |  | 9 |  |" in text
    assert "| spread p99 vs peer | MET | MISSED | 1 of 2 |" in text
    assert "| secured | N/A | N/A | not judged |" in text
    assert "- run 2: a note" in text


def test_a_run_that_fails_ends_the_series_and_the_runs_done_are_still_reported(
    monkeypatch, capsys, tmp_path  # type: ignore[no-untyped-def]
) -> None:
    from fastlane.bench import runner

    outcomes = iter([run(0.3, 2.0, 9.0), runner.EXIT_FAILED, run(0.1, 0.2, 0.3)])
    monkeypatch.setattr(runner, "_measure_once", lambda options, out, progress: next(outcomes))
    code = runner.run_benchmark(runner.Options(scenario="spread", repeat=3, out=str(tmp_path)))
    assert code == runner.EXIT_FAILED
    report = capsys.readouterr().out
    assert report.startswith("# fastlane bench: spread, 1 run\n") and "| worst |" in report
    assert (tmp_path / "result.md").read_text() == report.removesuffix("\n")  # print adds a line end
