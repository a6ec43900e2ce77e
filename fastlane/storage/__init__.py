"""Durable state: the Store protocol and its SQLite and PostgreSQL backends."""

from fastlane.storage.base import (
    AttemptResult,
    Dispatch,
    Heartbeat,
    Occurrence,
    Page,
    ResultOutcome,
    Store,
    open_store,
)

__all__ = [
    "AttemptResult",
    "Dispatch",
    "Heartbeat",
    "Occurrence",
    "Page",
    "ResultOutcome",
    "Store",
    "open_store",
]
