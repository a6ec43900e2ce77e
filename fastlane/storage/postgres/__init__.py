"""The PostgreSQL backend (asyncpg): production and multi-node.

``store`` holds :class:`PostgresStore` (lifecycle and jobs), built from the mixins of ``lane``
(the fast lane), ``runs``, ``shards`` (leases and membership), ``changes`` (LISTEN/NOTIFY),
``tokens`` (API tokens) and ``audit`` (the audit trail) over ``connection``; ``queries`` holds the dialect's named SQL, under
the same names as the SQLite backend's.
"""

from fastlane.storage.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
