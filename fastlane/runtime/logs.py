"""Logs: one JSON object per line, with the ids a record carries as extra fields (plain text at a terminal)."""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime

import orjson

_CONTEXT_FIELDS = ("node_id", "job_id", "run_id", "attempt", "tenant", "worker_id", "shard_id")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _CONTEXT_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


LOG_FORMAT_ENV = "FASTLANE_LOG_FORMAT"  # json or text; unset: text at a terminal, JSON otherwise


def configure(level: str = "INFO", *, json: bool | None = None) -> None:
    """Log to stderr at ``level``: JSON lines (``json``), or plain text for people. ``json=None``
    decides by ``$FASTLANE_LOG_FORMAT``, else by stderr: text at a terminal, JSON for a collector."""
    if json is None:
        chosen = os.environ.get(LOG_FORMAT_ENV, "").strip().lower()
        json = chosen == "json" if chosen in ("json", "text") else not sys.stderr.isatty()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
