"""Durable state: the :class:`Store` protocol, its SQLite and PostgreSQL backends, and :func:`open_store`."""

from datetime import timedelta

from fastlane.domain.records import (
    AttemptResult,
    CappedDispatches,
    Change,
    ChangeKind,
    Dispatch,
    Heartbeat,
    JobFilter,
    Occurrence,
    Page,
    RunFilter,
)
from fastlane.errors import ConfigurationError
from fastlane.storage.base import DEFAULT_SHARD_COUNT, Store
from fastlane.storage.late_reports import Reporter, ReporterOf
from fastlane.storage.results import Cancellation, Materialised, ResultOutcome

__all__ = [
    "DEFAULT_SHARD_COUNT",
    "AttemptResult",
    "Cancellation",
    "Change",
    "ChangeKind",
    "CappedDispatches",
    "Dispatch",
    "Heartbeat",
    "JobFilter",
    "Materialised",
    "Occurrence",
    "Page",
    "Reporter",
    "ReporterOf",
    "ResultOutcome",
    "RunFilter",
    "Store",
    "open_store",
    "redacted_url",
]


def open_store(url: str, *, shard_count: int = DEFAULT_SHARD_COUNT, lease_ttl: timedelta | None = None,
               node: bool = False) -> Store:
    """Make a store for ``sqlite:///path`` or ``postgresql://...``; call ``migrate()`` before use.
    Nothing is read or written until then.

    ``node``: the store of a node (not of a one-shot command such as ``fastlane migrate``). On
    SQLite, which is for one node, its first use takes a lock on the file that it holds until it
    is closed, and a second node's store fails with :class:`ConfigurationError` naming the
    first's process. PostgreSQL takes any number of nodes; a node's store keeps a fixed pool of
    sessions (see :class:`~fastlane.storage.postgres.PostgresStore`).

    ``lease_ttl`` is the node's shard lease TTL (default: the default of ``--shard-lease-ttl``).
    On PostgreSQL every connection's ``idle_in_transaction_session_timeout``, ``lock_timeout``
    and ``statement_timeout`` derive from it, so that no node holds a lock past its lease. SQLite
    needs no such thing: one node, one writer at a time, no row locks that could outlive a lease
    (its waits are bounded by ``busy_timeout``).

    Raises:
        ConfigurationError: The URL is not one of these, or an SQLite file's directory does not
            exist.
    """
    if url.startswith("sqlite://"):
        from fastlane.storage.sqlite import SQLiteStore

        return SQLiteStore(url, shard_count=shard_count, node_lock=node)
    if url.startswith(("postgresql://", "postgres://")):
        from fastlane.storage.postgres import PostgresStore

        if lease_ttl is None:
            return PostgresStore(url, shard_count=shard_count, fixed_pool=node)
        return PostgresStore(url, shard_count=shard_count, lease_ttl=lease_ttl, fixed_pool=node)
    raise ConfigurationError(
        f"unsupported database URL {url!r}: use sqlite:///path/to/file.db or postgresql://user@host/db"
    )


def redacted_url(url: str) -> str:
    """A database URL without its password, fit for logs. Taken apart by hand rather than by
    ``urllib``: a multi-host URL (``user:pw@h1:5432,h2:5432``) has no single port to parse."""
    scheme, sep, rest = url.partition("://")
    credentials, at, hosts = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{hosts}"
