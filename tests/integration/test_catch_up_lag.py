"""Catch-up runs (already late when the node first holds them) are kept out of the trigger-lag
SLO: a one-shot created for 2020 must not put years into ``fastlane_trigger_lag_seconds``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from test_engine import RecordingDispatch, start_engine, stop_engine, until

from fastlane.domain.models import JobSpec, Schedule


async def test_a_run_for_a_past_instant_counts_as_catch_up_not_as_trigger_lag(store):
    dispatch = RecordingDispatch()
    lane, ownership, tasks = await start_engine(store, dispatch)
    registry = lane._metrics.registry
    try:
        past, _ = await store.jobs.create_job(JobSpec(name="past", job_type="t",
                                                 schedule=Schedule.at_instant(datetime(2020, 1, 1, tzinfo=UTC))))
        lane.job_changed(past)
        ticking, _ = await store.jobs.create_job(JobSpec(name="ticking", job_type="t",
                                                    schedule=Schedule.interval(timedelta(milliseconds=200))))
        lane.job_changed(ticking)
        await until(lambda: dispatch.times_of(past.job_id) and len(dispatch.times_of(ticking.job_id)) >= 3)
        assert registry.get_sample_value("fastlane_catch_up_lag_seconds_count") == 1
        assert registry.get_sample_value("fastlane_catch_up_lag_seconds_sum") > 6 * 365 * 86_400
        on_time_count = registry.get_sample_value("fastlane_trigger_lag_seconds_count")
        assert on_time_count >= 3
        assert registry.get_sample_value("fastlane_trigger_lag_seconds_sum") < on_time_count * 1.0
    finally:
        await stop_engine(lane, ownership, tasks)
