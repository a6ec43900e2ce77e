"""Template filters: instants, durations and lags as people read them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson


def instant(value: datetime | None) -> str:
    """``2026-11-25 14:03:07.123Z``: UTC to the millisecond, the precision the scheduler keeps."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def duration(value: timedelta | None) -> str:
    """``3.2 ms``, ``1.50 s``, ``4 min 10 s``, ``2 h 5 min``; a dash when unknown."""
    if value is None:
        return "—"
    seconds = value.total_seconds()
    sign, seconds = ("-" if seconds < -0.00005 else ""), abs(seconds)  # no "-0.0 ms"
    if seconds < 1:
        return f"{sign}{seconds * 1000:.1f} ms"
    if seconds < 60:
        return f"{sign}{seconds:.2f} s"
    if seconds < 3600:
        return f"{sign}{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400 * 2:
        return f"{sign}{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{sign}{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def milliseconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} ms"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f}%"


def data(value: bytes | None) -> str:
    """A payload or an output for a page: JSON indented, other bytes by their size (the page escapes it)."""
    if not value:
        return "—"
    try:
        return orjson.dumps(orjson.loads(value), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return f"{len(value):,} bytes, not JSON"


FILTERS: dict[str, Callable[..., Any]] = {
    "instant": instant, "duration": duration, "ms": milliseconds, "percent": percent, "data": data,
}
