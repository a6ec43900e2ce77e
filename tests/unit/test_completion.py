"""``fastlane completion``: the script completes commands and flags of this very version, in a real bash."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fastlane.cli.main import build_parser, main


def completions(script: Path, *words: str) -> list[str]:
    """What bash offers for the last of ``words`` (``fastlane`` first), with the script sourced."""
    quoted = " ".join(f"'{word}'" for word in words)
    program = f"source '{script}'; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _fastlane; " \
              'printf "%s\\n" "${COMPREPLY[@]}"'
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


@pytest.fixture
def script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    if shutil.which("bash") is None:
        pytest.fail("bash is needed to test the completion script")
    assert main(["completion", "bash"]) == 0
    path = tmp_path / "fastlane.bash"
    path.write_text(capsys.readouterr().out)
    return path


def test_commands_subcommands_and_flags_complete_where_they_belong(script: Path) -> None:
    assert completions(script, "fastlane", "jo") == ["jobs"]
    assert completions(script, "fastlane", "jobs", "up") == ["update"]
    assert completions(script, "fastlane", "jobs", "create", "--concurrency-l") == ["--concurrency-limit"]
    assert completions(script, "fastlane", "--server", "node-2", "runs", "t") == ["tail"]  # values skipped
    assert completions(script, "fastlane", "runs", "get", "some-run", "--all") == ["--all-tracebacks"]
    assert completions(script, "fastlane", "serve", "--priority") == ["--priority-reserve"]


def test_every_command_of_the_parser_is_offered(script: Path) -> None:
    commands = {name for action in build_parser()._actions if hasattr(action, "choices") and action.choices
                for name in action.choices}
    assert {"serve", "worker", "jobs", "runs", "cluster", "completion"} <= commands
    assert set(completions(script, "fastlane", "")) >= commands


def test_zsh_gets_the_same_function_through_bashcompinit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("#compdef fastlane\n") and "bashcompinit" in text and "complete -o default -F _fastlane" in text


def fish_completions(script: Path, line: str) -> list[str]:
    """What a real fish offers at the end of ``line``, with the script sourced."""
    done = subprocess.run(["fish", "--no-config", "-c", f"source '{script}'; complete -C '{line}'"],
                          capture_output=True, text=True, timeout=30, check=True)
    return [entry.split("\t")[0] for entry in done.stdout.splitlines()]


def test_fish_completes_commands_subcommands_and_flags_where_they_belong(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("fish") is None:
        pytest.fail("fish is needed to test its completion script (make tools installs it)")
    assert main(["completion", "fish"]) == 0
    script = tmp_path / "fastlane.fish"
    script.write_text(capsys.readouterr().out)
    assert fish_completions(script, "fastlane jo") == ["jobs"]
    assert fish_completions(script, "fastlane jobs up") == ["update"]
    assert fish_completions(script, "fastlane jobs create --concurrency-l") == ["--concurrency-limit"]
    assert fish_completions(script, "fastlane --server node-2 runs t") == ["tail"]  # values skipped
    assert fish_completions(script, "fastlane jobs backfill --ov") == ["--overlap"]
    assert "--jitter" not in fish_completions(script, "fastlane jobs backfill --")  # each its own flags
    commands = {name for action in build_parser()._actions if hasattr(action, "choices") and action.choices
                for name in action.choices}
    assert set(fish_completions(script, "fastlane ")) >= commands
