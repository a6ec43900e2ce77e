"""Durable state: the Store protocol and its SQLite and PostgreSQL backends."""

from fastlane.storage.base import (
    AttemptResult,
    Cancellation,
    Change,
    Dispatch,
    Heartbeat,
    Materialised,
    Occurrence,
    Page,
    ResultOutcome,
    Store,
    open_store,
)

__all__ = [
    "AttemptResult",
    "Cancellation",
    "Change",
    "Materialised",
    "Dispatch",
    "Heartbeat",
    "Occurrence",
    "Page",
    "ResultOutcome",
    "Store",
    "open_store",
]
