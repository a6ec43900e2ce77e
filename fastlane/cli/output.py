"""Printing for the CLI: aligned plain-text tables, key/value blocks and JSON documents."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import orjson

from fastlane.rpc.wire import rfc3339

MISSING = "-"


def cell(value: Any) -> str:
    """How one value reads in a table: instants in UTC RFC 3339, nothing as ``-``."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return rfc3339(value) or MISSING
    return str(value)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell and separated by two spaces; no trailing blanks."""
    lines = [list(headers), *([cell(value) for value in row] for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(headers))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def format_fields(pairs: Iterable[tuple[str, Any]]) -> str:
    """A key/value block with the values aligned, for showing one object."""
    items = [(key, cell(value)) for key, value in pairs]
    width = max((len(key) for key, _ in items), default=0)
    return "\n".join(f"{key.ljust(width)}  {value}".rstrip() for key, value in items)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    print(format_table(headers, rows))


def print_fields(pairs: Iterable[tuple[str, Any]]) -> None:
    print(format_fields(pairs))


def print_json(document: Any) -> None:
    """Pretty JSON on stdout. Callers convert instants with :func:`rfc3339` first, so every
    timestamp reads the same (``Z`` for UTC) whatever produced it."""
    sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")


def note(message: str) -> None:
    """A remark for the person at the terminal that must not pollute parsable output."""
    print(message, file=sys.stderr)
