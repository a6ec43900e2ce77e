"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from secured_nodes import ENGINE_SHARDS, SecuredNode, secured_node

from fastlane.storage import open_store


@pytest.fixture
async def store(db_url):  # type: ignore[no-untyped-def]
    """A migrated store of either backend with ENGINE_SHARDS shards, closed after the test."""
    store = open_store(db_url, shard_count=ENGINE_SHARDS)
    await store.migrate()
    yield store
    await store.close()


@pytest.fixture
async def secured(db_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SecuredNode]:
    """A node requiring tokens on either backend (see :func:`secured_node`), without TLS."""
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)
    async with secured_node(db_url) as node:
        yield node
