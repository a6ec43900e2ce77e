"""The PostgreSQL backend (asyncpg): production and multi-node.

Only what PostgreSQL does differently from the one store (:mod:`fastlane.storage.store`): its pool
(``connection``, with the session limits that keep a node's locks from outliving its leases, and
``hosts`` and ``server_identity`` for failover), its transactions (``tx``), its change watch
(``changes``: LISTEN/NOTIFY), and its own SQL (``queries``).
"""

from __future__ import annotations

import random
from datetime import timedelta

from fastlane.domain.limits import DEFAULT_SHARD_LEASE_TTL
from fastlane.storage.postgres.database import PostgresDatabase
from fastlane.storage.store import SQLStore

__all__ = ["PostgresDatabase", "PostgresStore"]


class PostgresStore(SQLStore):
    """The store on PostgreSQL through an asyncpg pool."""

    def __init__(
        self,
        url: str,
        *,
        shard_count: int,
        pool_size: int = 10,
        rng: random.Random | None = None,
        lease_ttl: timedelta = DEFAULT_SHARD_LEASE_TTL,
        fixed_pool: bool = False,
    ) -> None:
        """``lease_ttl`` is the nodes' shard lease TTL: the session limits of every connection
        derive from it (see :class:`~fastlane.storage.postgres.connection.SessionLimits`).
        ``fixed_pool`` (a node's store): all ``pool_size`` sessions are opened at first use and
        kept, instead of one that grows on demand and shrinks when idle."""
        super().__init__(PostgresDatabase(url, pool_size=pool_size, lease_ttl=lease_ttl, rng=rng,
                                          fixed_pool=fixed_pool),
                         shard_count=shard_count, rng=rng)
