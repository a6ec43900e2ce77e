"""docs/state-machine.md draws the lifecycle's tables: its Mermaid edges are exactly theirs."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from fastlane.domain import lifecycle

DOC = Path(__file__).resolve().parents[2] / "docs" / "state-machine.md"
EDGE = re.compile(r"(?P<source>\[\*\]|\w+) --> (?P<target>\w+) : (?P<event>\w+)")

Edges = tuple[set[tuple[str, str]], set[tuple[str, str, str]]]  # (event, state) from [*]; (state, event, state)


def diagrams(text: str) -> dict[str, list[str]]:
    """The lines of each ```mermaid block, by the ``##`` heading it is under."""
    found: dict[str, list[str]] = {}
    heading, block = "", None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.strip() == "```mermaid":
            block = []
        elif line.strip() == "```" and block is not None:
            if heading in found:
                raise ValueError(f"two diagrams under {heading!r}")
            found[heading], block = block, None
        elif block is not None:
            block.append(line)
    return found


def edges(lines: Iterable[str]) -> Edges:
    """A ``stateDiagram-v2``'s edges; any other line but blanks and ``%%`` comments is an error, so
    an edge written some other way cannot slip past the comparison."""
    lines = [line.strip() for line in lines]
    if not lines or lines[0] != "stateDiagram-v2":
        raise ValueError("not a stateDiagram-v2")
    written: set[tuple[str, str]] = set()
    moves: set[tuple[str, str, str]] = set()
    for line in lines[1:]:
        if not line or line.startswith("%%"):
            continue
        match = EDGE.fullmatch(line)
        if match is None:
            raise ValueError(f"not an edge: {line!r}")
        source, target, event = match["source"], match["target"], match["event"]
        edge_set: set = written if source == "[*]" else moves
        edge = (event, target) if source == "[*]" else (source, event, target)
        if edge in edge_set:
            raise ValueError(f"drawn twice: {line!r}")
        edge_set.add(edge)
    return written, moves


def as_strings(creations: Iterable[tuple[lifecycle.RunEvent | lifecycle.JobEvent, object]],
               transitions: Iterable[tuple[object, object, object]]) -> Edges:
    return ({(str(e), str(t)) for e, t in creations}, {(str(s), str(e), str(t)) for s, e, t in transitions})


@pytest.fixture(scope="module")
def drawn() -> dict[str, list[str]]:
    return diagrams(DOC.read_text())


def test_the_run_diagram_is_the_run_table(drawn: dict[str, list[str]]) -> None:
    assert edges(drawn["Runs"]) == as_strings(lifecycle.RUN_CREATIONS, lifecycle.RUN_TRANSITIONS)


def test_the_job_diagram_is_the_job_table(drawn: dict[str, list[str]]) -> None:
    assert edges(drawn["Jobs"]) == as_strings(lifecycle.JOB_CREATIONS, lifecycle.JOB_TRANSITIONS)


def test_the_set_table_names_every_set_with_its_states() -> None:
    rows = {match[1]: match[2] for match in re.finditer(r"^\| `(\w+)` \| ([^|]+) \|", DOC.read_text(), re.M)}
    for name in ("WITH_A_WORKER", "OVERLAP_ACTIVE", "WAITING", "REPLAYABLE", "RERUNNABLE", "FINAL", "PAUSE_FROM",
                 "RESUME_FROM"):
        assert set(re.findall(r"`(\w+)`", rows[name])) == {state.value for state in getattr(lifecycle, name)}, name


def test_the_parser_reads_what_is_drawn_and_refuses_what_is_not() -> None:
    text = "## A\n```mermaid\nstateDiagram-v2\n    [*] --> x : make\n    %% note\n    x --> y : go\n```\n"
    assert edges(diagrams(text)["A"]) == ({("make", "x")}, {("x", "go", "y")})
    with pytest.raises(ValueError, match="not an edge"):
        edges(["stateDiagram-v2", "x -> y : go"])
    with pytest.raises(ValueError, match="drawn twice"):
        edges(["stateDiagram-v2", "x --> y : go", "x --> y : go"])
    with pytest.raises(ValueError, match="not a stateDiagram-v2"):
        edges(["flowchart LR", "x --> y : go"])
