"""The shards this node owns, as the fast lane's stages see them: a fence per shard, and what to do
when the database refuses one.

A *fence* is the :class:`~fastlane.domain.models.ShardLease` a write on behalf of a shard is
conditioned on; its ``token`` is the shard's *fence token* (never a lease token: that is an
attempt's, see :mod:`fastlane.engine.dispatch.lease_tokens`). A write refused for a stale fence
means the shard is lost: :meth:`Fencing.stale` says so, and the node drops the shard at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fastlane.domain.models import ShardLease

ShardStale = Callable[[int, int, str], None]  # shard id, the fence token that was refused, why


class ShardView(Protocol):
    """The node's shard ownership (:class:`~fastlane.engine.shards.ShardOwnership`), as the lane reads it."""

    def fence(self, shard_id: int) -> ShardLease | None: ...

    def owned(self) -> list[int]: ...


class Fencing(Protocol):
    """What a stage that writes on behalf of shards needs: the fence of each, and where to report a refused one."""

    def fence(self, shard_id: int) -> ShardLease | None:
        """The lease this node owns the shard by; None when it does not own it."""
        ...

    def stale(self, shard_id: int, fence_token: int, why: str) -> None:
        """A fenced write with ``fence_token`` was refused: the shard is probably lost."""
        ...


class OwnedShards(Fencing, Protocol):
    """:class:`Fencing`, and the shards owned now (for the loops that scan them)."""

    def owned(self) -> list[int]: ...


class ShardFencing:
    """The node's shard view and its stale-fence callback as one :class:`OwnedShards`."""

    def __init__(self, shards: ShardView, on_stale: ShardStale) -> None:
        self.fence = shards.fence
        self.owned = shards.owned
        self._on_stale = on_stale

    def stale(self, shard_id: int, fence_token: int, why: str) -> None:
        self._on_stale(shard_id, fence_token, why)
