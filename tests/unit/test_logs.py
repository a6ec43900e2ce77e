"""Where a node's logs go and in what form: text for a person at a terminal, JSON for a collector."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from fastlane.runtime import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_root_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(("stderr", "chosen", "as_json"), [
    (Terminal(), "", False), (io.StringIO(), "", True), (Terminal(), "json", True), (io.StringIO(), "text", False),
    (io.StringIO(), "yaml", True),  # an unknown choice falls back to the stream's
])
def test_logs_are_text_at_a_terminal_and_json_elsewhere_unless_told(
    stderr: io.StringIO, chosen: str, as_json: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setenv(logs.LOG_FORMAT_ENV, chosen)
    logs.configure("INFO")
    logging.getLogger("fastlane.test").info("node %s up", "n1", extra={"node_id": "n1"})
    line = stderr.getvalue().strip()
    if as_json:
        entry = orjson.loads(line)
        assert (entry["msg"], entry["level"], entry["node_id"]) == ("node n1 up", "info", "n1")
    else:
        assert line.endswith("INFO fastlane.test: node n1 up") and not line.startswith("{")
