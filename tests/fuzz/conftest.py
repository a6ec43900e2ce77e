"""Fixtures of the fuzz suite: a real daemon per backend (SQLite file, fresh PostgreSQL database),
and a summary of every fuzz test's answers by status code at the end of the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fuzz_harness import TALLIES, FuzzNode


@pytest.fixture(params=[
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
])
def fuzz_backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(backend name, database URL): a temporary SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return "sqlite", request.getfixturevalue("sqlite_url")
    return "postgres", request.getfixturevalue("pg_dsn")


@pytest.fixture
def fuzz_node(fuzz_backend: tuple[str, str], tmp_path: Path) -> Iterator[FuzzNode]:
    backend, url = fuzz_backend
    node = FuzzNode(backend, url, tmp_path)
    try:
        node.start()
        yield node
    finally:
        node.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLIES:
        return
    terminalreporter.section("fuzz answers by status code")
    for entry in TALLIES:
        codes = ", ".join(f"{code} {count}" for code, count in entry["codes"].items())
        terminalreporter.write_line(
            f"{entry['test']} [{entry['backend']}]: {entry['requests']} answers in {entry['seconds']} s: {codes}")
        terminalreporter.write_line(f"    {entry['path']}")
