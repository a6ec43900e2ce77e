"""The API's compatibility checks catch what they are there for.

``make test`` runs ``buf lint`` and ``buf breaking`` on ``proto/``; these tests prove that the two
checks fail on the changes they guard against, on a copy of ``proto/`` with one change made, so a
configuration that silently checks nothing (a wrong module path, an empty rule set, a baseline of
the wrong files) fails here. buf comes from ``tools/`` (``make proto-lint`` installs it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "tools" / "node_modules" / ".bin" / "buf"
BASELINE = ROOT / "proto" / "baseline" / "v1.binpb"


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    if not BUF.exists():
        pytest.fail(f"buf is not installed at {BUF}: run `make proto-lint` (it runs npm ci in tools/)")
    shutil.copytree(ROOT / "proto", tmp_path / "proto", ignore=shutil.ignore_patterns("baseline"))
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    return tmp_path


def buf(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUF), *args], cwd=where, capture_output=True, text=True, timeout=120, check=False)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} is not in {path.name}: the test's mutation needs updating"
    path.write_text(text.replace(old, new, 1))


def test_the_unchanged_protos_pass_both_checks(copy: Path) -> None:
    assert buf(copy, "lint").returncode == 0
    result = buf(copy, "breaking", "--against", str(BASELINE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_renumbered_field_is_a_breaking_change(copy: Path) -> None:
    edit(copy / "proto/fastlane/v1/workers.proto", "string job_type = 3;", "string job_type = 33;")
    result = buf(copy, "breaking", "--against", str(BASELINE))
    assert result.returncode != 0
    assert "Assignment" in result.stdout


def test_a_removed_enum_value_is_a_breaking_change(copy: Path) -> None:
    edit(copy / "proto/fastlane/v1/common.proto", "  ATTEMPT_OUTCOME_CANCELLED = 7;", "")
    result = buf(copy, "breaking", "--against", str(BASELINE))
    assert result.returncode != 0
    assert "\"7\" on enum \"AttemptOutcome\" was deleted" in result.stdout


def test_an_rpc_sharing_another_rpcs_messages_fails_the_lint(copy: Path) -> None:
    edit(copy / "proto/fastlane/v1/jobs.proto", "rpc GetJob(GetJobRequest) returns (GetJobResponse);",
         "rpc GetJob(PauseJobRequest) returns (GetJobResponse);")
    result = buf(copy, "lint")
    assert result.returncode != 0
    assert "GetJob" in result.stdout
