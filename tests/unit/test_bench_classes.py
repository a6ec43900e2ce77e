"""The fairness and priority benchmarks' pure parts: what they offer, splitting runs by class, the
figures and targets computed from them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fastlane.bench.cluster import BusyWorkers
from fastlane.bench.harness import Bench, even_offsets, job_name, label_of, split_by_label, started_between
from fastlane.bench.report import render_markdown
from fastlane.bench.scenarios import SCENARIOS, fairness, priority
from fastlane.bench.stats import RunRecord, Status, percentiles
from fastlane.bench.targets import (
    HIGH_PRIORITY,
    KEEPING_HISTORY,
    LOW_PRIORITY,
    NOISY,
    QUIET_ALONE,
    QUIET_WITH_NOISY,
    TRIMMING_HISTORY,
    evaluate,
)

from fastlane.cli.main import main
from fastlane.engine.dispatch.ready_queue import AGING_BOUND_SECONDS


def record(run_id: str, job_id: str, scheduled: int = 0, started: int = 0) -> RunRecord:
    return RunRecord(run_id=run_id, scheduled_us=scheduled, released_us=0, received_us=started, job_id=job_id,
                     started_us=started)


# -- offers ------------------------------------------------------------------------------------


def test_even_offsets_fall_due_at_the_rate_from_the_start() -> None:
    assert even_offsets(4.0, 10.0, 1.0) == [10.0, 10.25, 10.5, 10.75]
    assert len(even_offsets(2_000.0, 5.0, 30.0)) == 60_000


def test_a_job_name_gives_back_its_label_even_with_dashes_in_it() -> None:
    assert label_of(job_name("quiet-with-noisy", 12)) == "quiet-with-noisy"
    assert label_of(job_name("high", 0)) == "high"


# -- busy workers ------------------------------------------------------------------------------


def test_busy_workers_capacity_is_slots_times_runs_per_slot_a_second() -> None:
    busy = BusyWorkers(handler_ms=50, concurrency=10, processes=1)
    assert busy.slots == 10
    assert busy.capacity_runs_per_s() == 200.0
    assert busy.capacity_runs_per_s(nodes=2) == 400.0  # a worker's concurrency is per node stream
    assert BusyWorkers(handler_ms=50, concurrency=10, processes=3).capacity_runs_per_s() == 600.0
    assert busy.as_json() == {"worker_processes": 1, "worker_concurrency": 10, "handler_ms": 50,
                              "handler_jitter": 0.0, "capacity_runs_per_s": 200.0}
    assert busy.environment() == {"FASTLANE_BENCH_HANDLER_MS": "50", "FASTLANE_BENCH_HANDLER_JITTER": "0"}


# -- splitting runs by class -------------------------------------------------------------------


def test_runs_split_by_their_jobs_label_and_unknown_jobs_are_left_out() -> None:
    labels = {"j1": "high", "j2": "low", "j3": "low"}
    split = split_by_label([
        record("r1", "j1", 0, 5_000), record("r2", "j2", 0, 9_000), record("r3", "j3", 0, 1_000),
        record("r2", "j2", 0, 12_000),  # the same run again: a duplicate of its class
        record("r9", "elsewhere", 0, 1),
    ], labels)
    assert set(split) == {"high", "low"}
    assert split["high"].delivered == 1 and split["high"].start_lags_ms() == [5.0]
    assert split["low"].delivered == 2 and split["low"].duplicates == 1
    assert sorted(split["low"].start_lags_ms()) == [1.0, 9.0]


def test_runs_started_between_bounds_count_each_run_once() -> None:
    records = [record("a", "j", started=10), record("a", "j", started=11), record("b", "j", started=20),
               record("c", "j", started=30)]
    assert started_between(records, 10, 30) == 2  # a (twice) and b; 30 is past the end


# -- fairness ----------------------------------------------------------------------------------


def test_fairness_offers_a_tenth_of_capacity_quiet_and_ten_times_noisy() -> None:
    planned = fairness.offers(200.0, 5.0)
    by_label = {label: [offer for offer in planned if offer.label == label] for label in fairness.SYSTEMS}
    assert len(by_label[fairness.ALONE]) == len(by_label[fairness.WITH_NOISY]) == 100  # 20/s for 5 s
    assert {offer.tenant for offer in by_label[fairness.ALONE] + by_label[fairness.WITH_NOISY]} == {"quiet"}
    assert all(offer.offset_s < 5.0 for offer in by_label[fairness.ALONE])
    assert all(5.0 <= offer.offset_s < 10.0 for offer in by_label[fairness.WITH_NOISY])
    flood = by_label[fairness.FLOOD]
    assert len(flood) == 10_000 and {offer.tenant for offer in flood} == {"noisy"}  # 2,000/s for 5 s
    assert all(5.0 <= offer.offset_s < 10.0 for offer in flood)
    assert [offer.offset_s for offer in planned] == sorted(offer.offset_s for offer in planned)
    assert fairness.offered(planned) == {fairness.ALONE: 100, fairness.WITH_NOISY: 100, fairness.FLOOD: 10_000}


@pytest.mark.parametrize(("slots", "share", "cap"), [(10, 0.8, 8), (20, 0.8, 16), (1, 0.8, 1), (2, 0.8, 1),
                                                    (10, 1.0, 9), (10, None, None)])
def test_the_noisy_tenant_is_capped_below_the_slots(slots: int, share: float | None, cap: int | None) -> None:
    assert fairness.noisy_cap(slots, share) == cap


def fairness_document(alone_p99: float | None, with_noisy_p99: float | None, *, started: int = 100,
                      cap: int | None = 8) -> dict[str, object]:
    def result(system: str, p99: float | None, jobs: int, got: int) -> dict[str, object]:
        lags = percentiles([] if p99 is None else [p99])
        return {"system": system, "jobs": jobs, "started": got, "start_lag_ms": lags, "noisy_in_flight_cap": cap}

    return {"scenario": "fairness", "results": [result(QUIET_ALONE, alone_p99, 100, 100),
                                                result(QUIET_WITH_NOISY, with_noisy_p99, 100, started),
                                                result(NOISY, 5_000.0, 10_000, 900)]}


def test_fairness_target_is_the_quiet_p99_with_noisy_over_alone() -> None:
    (target,) = evaluate(fairness_document(1.5, 2.4))
    assert target.measured == 1.6 and target.limit == 2.0 and target.status is Status.MET
    assert "capped at 8" in target.note
    (target,) = evaluate(fairness_document(1.5, 30.0, cap=None))
    assert target.measured == 20.0 and target.status is Status.MISSED and "not capped" in target.note


def test_a_quiet_run_that_never_started_misses_the_fairness_target() -> None:
    (target,) = evaluate(fairness_document(1.5, 2.0, started=99))
    assert target.measured == math.inf and target.status is Status.MISSED
    assert "only 99 of 100 runs started" in target.note


def test_fairness_without_figures_is_not_applicable() -> None:
    (target,) = evaluate(fairness_document(None, None))
    assert target.status is Status.NOT_APPLICABLE
    (target,) = evaluate(fairness_document(-0.1, 1.0))  # started before the instant: no ratio
    assert target.status is Status.NOT_APPLICABLE and "≤ 0" in target.note


# -- priority ----------------------------------------------------------------------------------


def test_priority_offers_twice_capacity_one_run_in_ten_high() -> None:
    planned = priority.offers(200.0, 5.0)
    assert len(planned) == 2_000  # 400/s for 5 s
    high = [offer for offer in planned if offer.label == "high"]
    assert len(high) == 200 and {offer.priority for offer in high} == {priority.HIGH}
    assert {offer.priority for offer in planned if offer.label == "low"} == {priority.LOW}
    assert priority.HIGH >= 100 and priority.LOW <= 0


def test_high_runs_stay_ahead_of_the_oldest_waiting_low_run_through_a_full_size_overload() -> None:
    # Aging: a high run goes first only while the low one has waited less than (high - low) / 20 s.
    assert priority.high_ahead_for_s() == 55.0
    assert priority.oldest_low_wait_s(priority.OVERLOAD_S) == pytest.approx(40 * (1 - 160 / 360))
    assert priority.high_ahead_for_s() > 2 * priority.oldest_low_wait_s(priority.OVERLOAD_S)  # room for a slow machine
    # The last low run waits about as long as the backlog takes to drain: well within the aging bound.
    assert priority.drain_s(priority.OVERLOAD_S) < AGING_BOUND_SECONDS / 2


def priority_document(high_p99: float, low_max_ms: float, *, low_started: int = 900) -> dict[str, object]:
    return {"scenario": "priority", "results": [
        {"system": HIGH_PRIORITY, "jobs": 100, "started": 100, "start_lag_ms": {"p99": high_p99, "max": high_p99}},
        {"system": LOW_PRIORITY, "jobs": 900, "started": low_started, "start_lag_ms": {"p99": 1.0, "max": low_max_ms}},
    ]}


def test_priority_targets_are_the_high_p99_and_the_longest_low_wait() -> None:
    high, low = evaluate(priority_document(7.5, 42_000.0))
    assert (high.measured, high.limit, high.unit, high.status) == (7.5, 10.0, "ms", Status.MET)
    assert (low.measured, low.limit, low.unit, low.status) == (42.0, AGING_BOUND_SECONDS, "s", Status.MET)
    high, low = evaluate(priority_document(61.0, 120_000.0))
    assert high.status is Status.MISSED and low.status is Status.MISSED


def test_a_low_run_that_never_started_waited_past_any_bound() -> None:
    _, low = evaluate(priority_document(5.0, 1_000.0, low_started=899))
    assert low.measured == math.inf and low.status is Status.MISSED and "only 899 of 900" in low.note


def test_priority_without_results_is_not_applicable() -> None:
    assert [target.status for target in evaluate({"scenario": "priority", "results": []})] == [Status.NOT_APPLICABLE] * 2


# -- the command and the report ----------------------------------------------------------------


def test_both_scenarios_are_registered_with_a_budget(tmp_path: Path) -> None:
    bench = Bench(scenario="fairness", backend="sqlite", nodes=1, workers=1, scale=0.1, workdir=tmp_path)
    for name in ("fairness", "priority"):
        assert 0 < SCENARIOS[name].budget(bench) < 1_000


def test_bench_help_lists_fairness_and_priority(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    assert "fairness" in text and "priority" in text


def test_the_report_shows_the_workers_and_the_offered_load() -> None:
    result = {"system": QUIET_ALONE, "jobs": 100, "delivered": 100, "duplicates": 0, "started": 100,
              "start_lag_ms": percentiles([1.0]), "tenant": "quiet", "phase": "alone", "offered_runs_per_s": 20.0,
              **BusyWorkers(handler_ms=50, concurrency=10, processes=1).as_json(), "noisy_in_flight_cap": 8}
    text = render_markdown({"scenario": "fairness", "results": [result]})
    for row in ("| handler time | 50 ms |", "| capacity (slots x 1000 / handler ms) | 200 runs/s |",
                "| offered load | 20 runs/s |", "| runs started | 100 |", "| noisy tenant's cap in flight per node | 8 |"):
        assert row in text


# -- retention ---------------------------------------------------------------------------------


def retention_document(keeping: float, trimming: float, *, delivered: int = 100, trimmed: int = 5_000) -> dict:
    def result(system: str, p99: float, **more: object) -> dict:
        return {"system": system, "jobs": 100, "delivered": 100, "start_lag_ms": {"p99": p99}, **more}

    return {"scenario": "retention", "results": [
        result(KEEPING_HISTORY, keeping),
        {**result(TRIMMING_HISTORY, trimming, trimmed_while_due=trimmed), "delivered": delivered},
    ]}


def test_retention_target_is_the_p99_while_trimming_over_keeping() -> None:
    (target,) = evaluate(retention_document(2.0, 2.1))
    assert target.measured == 1.05 and target.status is Status.MET
    (target,) = evaluate(retention_document(2.0, 3.6))
    assert target.measured == 1.8 and target.status is Status.MISSED


def test_a_retention_run_that_lost_runs_or_trimmed_nothing_says_so() -> None:
    (target,) = evaluate(retention_document(2.0, 2.0, delivered=99))
    assert target.measured == math.inf and target.status is Status.MISSED
    (target,) = evaluate(retention_document(2.0, 2.0, trimmed=0))
    assert target.status is Status.NOT_APPLICABLE and "nothing was trimmed" in target.note
