"""docs/reference is what scripts/gen_reference.py makes of the source, and its check can fail."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gen_reference.py"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs: dataclasses look their module up by name.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_reference_pages_are_current(generator: ModuleType) -> None:
    problems = generator.check()
    assert not problems, "run `make reference`:\n" + "\n".join(problems)


def test_a_flag_without_help_is_reported(generator: ModuleType) -> None:
    from fastlane.cli.main import build_parser

    parser = build_parser()
    serve = next(command.parser for command in generator.commands(parser) if command.path == "fastlane serve")
    serve.add_argument("--undocumented-knob", metavar="N")

    assert generator.cli_problems(parser) == ["cli: `fastlane serve` --undocumented-knob has no help text"]
    page = generator.cli_page(parser)
    assert page.problems and not page.text


def test_a_positional_without_help_is_reported(generator: ModuleType) -> None:
    parser = argparse.ArgumentParser(prog="tool")
    verbs = parser.add_subparsers(dest="verb")
    show = verbs.add_parser("show", help="show a thing")
    show.add_argument("thing", metavar="THING")

    assert generator.cli_problems(parser) == ["cli: `tool show` THING has no help text"]


def test_an_undescribed_environment_variable_is_reported(generator: ModuleType) -> None:
    found = {variable.name: "fastlane/x.py:1" for variable in generator.ENVIRONMENT}
    found["FASTLANE_NEW_KNOB"] = "fastlane/new.py:7"

    problems = generator.environment_problems(found)

    assert len(problems) == 1 and "FASTLANE_NEW_KNOB (in fastlane/new.py:7)" in problems[0]


def test_a_python_constant_named_fastlane_is_not_a_variable(generator: ModuleType, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kit.py").write_text(
        'import os\n'
        'FASTLANE_ROOT = "/srv"  # a path, not a variable\n'
        'token = os.environ.get("FASTLANE_SECRET_KNOB")\n'
        'env = dict(FASTLANE_CHILD_KNOB="1")\n'
    )
    monkeypatch.setattr(generator, "ROOT", tmp_path)  # places are written relative to it

    assert set(generator.environment_names([tmp_path])) == {"FASTLANE_SECRET_KNOB", "FASTLANE_CHILD_KNOB"}
