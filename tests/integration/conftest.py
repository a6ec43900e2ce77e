"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from fastlane.storage import open_store

ENGINE_SHARDS = 4  # the shard count of the in-process engines (see test_engine.start_engine)


@pytest.fixture
async def store(db_url):  # type: ignore[no-untyped-def]
    """A migrated store of either backend with ENGINE_SHARDS shards, closed after the test."""
    store = open_store(db_url, shard_count=ENGINE_SHARDS)
    await store.migrate()
    yield store
    await store.close()
