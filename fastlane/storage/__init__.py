"""Durable state: the :class:`Store` protocol, its SQLite and PostgreSQL backends, and :func:`open_store`."""

from fastlane.domain.records import AttemptResult, Change, ChangeKind, Dispatch, Heartbeat, Occurrence, Page, RunFilter
from fastlane.errors import ConfigurationError
from fastlane.storage.base import DEFAULT_SHARD_COUNT, Store
from fastlane.storage.results import Cancellation, Materialised, ResultOutcome

__all__ = [
    "DEFAULT_SHARD_COUNT",
    "AttemptResult",
    "Cancellation",
    "Change",
    "ChangeKind",
    "Dispatch",
    "Heartbeat",
    "Materialised",
    "Occurrence",
    "Page",
    "ResultOutcome",
    "RunFilter",
    "Store",
    "open_store",
]


def open_store(url: str, *, shard_count: int = DEFAULT_SHARD_COUNT) -> Store:
    """Make a store for ``sqlite:///path`` or ``postgresql://...``; call ``migrate()`` before use."""
    if url.startswith("sqlite://"):
        from fastlane.storage.sqlite import SQLiteStore

        return SQLiteStore(url, shard_count=shard_count)
    if url.startswith(("postgresql://", "postgres://")):
        from fastlane.storage.postgres import PostgresStore

        return PostgresStore(url, shard_count=shard_count)
    raise ConfigurationError(
        f"unsupported database URL {url!r}: use sqlite:///path/to/file.db or postgresql://user@host/db"
    )
