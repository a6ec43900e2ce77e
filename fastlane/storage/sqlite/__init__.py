"""The SQLite backend (aiosqlite, WAL): the embedded default for a single node.

``store`` holds :class:`SQLiteStore` (lifecycle and jobs), built from the mixins of ``lane`` (the
fast lane), ``runs``, ``shards`` (leases and membership), ``tokens`` (API tokens) and ``audit``
(the audit trail) over ``connection``; ``queries`` holds the dialect's named SQL, under the same names as the
PostgreSQL backend's.
"""

from fastlane.storage.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
