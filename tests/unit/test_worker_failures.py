"""Failed attempts in a worker: the traceback goes with the result, and into the log without a flood."""

from __future__ import annotations

import logging

import pytest

from fastlane.domain import validation
from fastlane.domain.limits import MAX_ERROR_TRACEBACK
from fastlane.domain.models import AttemptOutcome
from fastlane.worker._failures import BURST, MAX_TRACEBACK, FailureLog, format_traceback
from fastlane.worker._runs import judge_attempt


class Slot:
    stop_reason = None


def charge_card() -> None:
    raise ValueError("card declined")


async def test_a_handler_that_raises_gives_its_traceback_with_the_verdict() -> None:
    async def handler() -> None:
        charge_card()

    verdict = await judge_attempt(handler, Slot(), None)  # type: ignore[arg-type]
    assert (verdict.outcome, verdict.error_code, verdict.error_message) == (
        AttemptOutcome.FAILED, "ValueError", "card declined")
    assert verdict.traceback.startswith("Traceback (most recent call last):")
    assert "in charge_card" in verdict.traceback and verdict.traceback.endswith("ValueError: card declined")


def test_a_long_traceback_keeps_its_end() -> None:
    with pytest.raises(RuntimeError) as raised:
        raise RuntimeError("x" * 20_000 + " the bottom")
    text = format_traceback(raised.value)
    assert len(text) == MAX_TRACEBACK and text.startswith("…") and text.endswith("x the bottom")


def test_the_node_keeps_a_tracebacks_lines_and_end_and_cleans_the_rest() -> None:
    assert validation.traceback_text("a\n\tb\x00c\rd") == "a\n\tb c d"
    long = "x" * MAX_ERROR_TRACEBACK + "ValueError: end"
    kept = validation.traceback_text(long)
    assert len(kept) == MAX_ERROR_TRACEBACK and kept.endswith("ValueError: end") and kept.startswith("…")


def test_every_failure_has_a_line_and_tracebacks_come_a_burst_then_one_a_second_per_job_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    failures = FailureLog(now=lambda: now[0])

    def fail(job_type: str, run_id: str, outcome: str = "failed") -> None:
        failures.failed(job_type=job_type, run_id=run_id, attempt=1, outcome=outcome, error="ValueError: declined",
                        traceback_text="Traceback:\nValueError: declined")

    with caplog.at_level(logging.INFO, logger="fastlane.worker"):
        for i in range(BURST + 5):
            fail("billing.charge", f"r{i}")
        fail("mail.send", "m0", "timed_out")
        lines = [record for record in caplog.records if record.levelno == logging.INFO]
        traced = [record for record in caplog.records if record.levelno == logging.WARNING]
        assert len(lines) == BURST + 6  # every failure has its line
        assert lines[0].getMessage() == "run r0 (billing.charge, attempt 1) failed: ValueError: declined"
        assert len(traced) == BURST + 1  # the flood of one type left the other's traceback in
        assert traced[0].getMessage().endswith("Traceback:\nValueError: declined")
        assert "m0 (mail.send, attempt 1) timed_out" in traced[-1].getMessage()
        now[0] += 1.0  # a second later: one more traceback, saying how many were left out
        fail("billing.charge", "later")
    assert "(5 tracebacks of billing.charge left out since the last)" in caplog.records[-1].getMessage()


def test_runs_get_prints_the_last_traceback_and_says_how_many_more(capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import UTC, datetime

    from fastlane.cli.views import print_tracebacks
    from fastlane.domain.models import Attempt

    def attempt(number: int, traced: str | None) -> Attempt:
        return Attempt(run_id="r", attempt=number, lease_token=number, worker_id="w", node_id="n",
                       outcome=AttemptOutcome.FAILED if traced else AttemptOutcome.LEASE_EXPIRED,
                       dispatched_at=datetime(2030, 1, 1, tzinfo=UTC), error_traceback=traced)

    attempts = [attempt(1, "Traceback:\nValueError: one"), attempt(2, None), attempt(3, "Traceback:\nValueError: three")]
    print_tracebacks(attempts)
    shown = capsys.readouterr().out
    assert "attempt 3 (failed) traceback:\nTraceback:\nValueError: three" in shown
    assert "ValueError: one" not in shown and "(1 earlier attempt raised too: --all-tracebacks shows it)" in shown
    print_tracebacks(attempts, every=True)
    shown = capsys.readouterr().out
    assert "ValueError: one" in shown and "ValueError: three" in shown and "earlier" not in shown
    print_tracebacks([attempt(1, None)])
    assert capsys.readouterr().out == ""
