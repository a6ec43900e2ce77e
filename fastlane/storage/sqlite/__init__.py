"""The SQLite backend (aiosqlite, WAL): the embedded default for a single node.

Only what SQLite does differently from the one store (:mod:`fastlane.storage.store`): its
connections (``connection``: a serialised writer and a reader, write faults named), its
transactions (``tx``), and its SQL (``queries``: the store's statements translated, a few written
out). Instants are stored as integer microseconds since the Unix epoch, UTC.
"""

from __future__ import annotations

import random

from fastlane.storage.sqlite.database import SQLiteDatabase
from fastlane.storage.store import SQLStore

__all__ = ["SQLiteDatabase", "SQLiteStore"]


class SQLiteStore(SQLStore):
    """The store on one SQLite file; ``node_lock``: a node's, which holds the file alone
    (:mod:`.node_lock`) until it is closed."""

    def __init__(self, url: str, *, shard_count: int, rng: random.Random | None = None, node_lock: bool = False) -> None:
        super().__init__(SQLiteDatabase(url, node_lock=node_lock), shard_count=shard_count, rng=rng)
