"""Which server history a node's connections reach: the system identifier and the timeline.

A failover puts nodes on another server. A promoted standby has the primary's system identifier
but a new timeline; a server restored from elsewhere has another system identifier. Either way
the new server's history may lack the last commits the nodes saw on the old one: with
asynchronous replication, the token bump of a shard a live node acquired can be gone, and that
token could be handed out again.

Two things keep the fence sound across that:

- every shard token acquired on timeline ``t`` is at least ``(t - 1) << 32`` (see
  ``TOKEN_FLOOR`` in ``queries``), so a token handed out after a promotion never equals one from
  before it, lost commit or not; a write fenced with the old token is refused;
- every new connection reads the identity (:data:`READ_IDENTITY`) and :class:`IdentityWatch`
  counts each change in :attr:`IdentityWatch.epoch`. The node's shard ownership drops every
  shard when the epoch moves and acquires them again, so its windows are rebuilt from what the
  new server holds rather than from memory of the old one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

log = logging.getLogger("fastlane.storage.postgres")

# The timeline is the first 8 hex digits of the current WAL file's name; on a standby (recovery)
# there is no current WAL position, and a node connected there cannot write anyway.
# pg_control_checkpoint() has a timeline too, but only from the first checkpoint after a
# promotion, which may come minutes later.
READ_IDENTITY = """
    SELECT (SELECT system_identifier FROM pg_control_system()) AS system_id,
           CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
           END AS timeline
"""


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    system_id: int
    timeline: int | None  # None on a server in recovery (a standby)

    def __str__(self) -> str:
        timeline = "standby" if self.timeline is None else f"timeline {self.timeline}"
        return f"system {self.system_id}, {timeline}"


class IdentityWatch:
    """Reads the identity of the server behind each new connection (the pool's ``init``) and
    counts the changes: :attr:`epoch` starts at 0 and goes up by one each time a connection finds
    a server other than the one before it."""

    def __init__(self) -> None:
        self.current: ServerIdentity | None = None
        self.epoch = 0

    async def check(self, connection: "asyncpg.Connection[asyncpg.Record]") -> None:
        row = await connection.fetchrow(READ_IDENTITY)
        assert row is not None  # a SELECT without FROM returns one row
        self.note(ServerIdentity(system_id=int(row["system_id"]), timeline=row["timeline"]))

    def note(self, seen: ServerIdentity) -> None:
        if self.current is not None and seen != self.current:
            self.epoch += 1
            log.warning("the database is another server now (%s, was %s): every shard is dropped and "
                        "acquired again", seen, self.current)
        self.current = seen
