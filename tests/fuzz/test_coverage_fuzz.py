"""The parsers that take untrusted bytes, fuzzed by coverage (atheris, under ``make chaos``), and
every input kept from those runs replayed in every run of the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from coverage_targets import TARGETS, kept_crashes

HERE = Path(__file__).resolve().parent
FUZZ_SECONDS = int(os.environ.get("FASTLANE_FUZZ_SECONDS", "60"))  # per target, under make chaos


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_seed_and_every_kept_crash_is_answered_not_raised(name: str) -> None:
    target = TARGETS[name]
    inputs = [*target.seeds(60), *(path.read_bytes() for path in kept_crashes(name))]
    assert len(inputs) >= 10  # the seeds really came from the strategies
    for data in inputs:
        target.check(data)  # raises for a crash: the input is named in the traceback's locals


def test_a_target_tells_a_crash_from_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal passes; an exception that is not an answer escapes, so the fuzzer sees it."""
    from fastlane.domain import validation

    target = TARGETS["job_spec"]
    valid = next(target.seeds(2))  # the strategies' first valid spec
    target.check(b"\xff\xff\xff")  # no protobuf message: refused
    target.check(b"")  # an empty spec: refused (no name, no schedule)
    target.check(valid)

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a validator that raises what no caller is sent")

    monkeypatch.setattr(validation, "validate_spec", broken)
    with pytest.raises(KeyError):
        target.check(valid)


@pytest.mark.chaos
@pytest.mark.timeout(FUZZ_SECONDS + 240)
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_coverage_guided_fuzzing_finds_no_crash(name: str, tmp_path: Path) -> None:
    # The dev extra installs atheris where its wheels exist (CPython 3.11, x86-64 Linux, as CI runs).
    pytest.importorskip("atheris", reason="atheris has no wheel for this platform or Python")
    before = set(kept_crashes(name))
    completed = subprocess.run(
        [sys.executable, str(HERE / "coverage_fuzz.py"), name, "--seconds", str(FUZZ_SECONDS),
         "--corpus", str(tmp_path / "corpus")],
        capture_output=True, text=True, timeout=FUZZ_SECONDS + 180, check=False)
    found = sorted(set(kept_crashes(name)) - before)
    assert completed.returncode == 0 and not found, (
        f"atheris found inputs that crash {name}: {[str(path) for path in found]}\n{completed.stderr[-4000:]}")
    assert "stat::number_of_executed_units" in completed.stderr  # it really fuzzed
