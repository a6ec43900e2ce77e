"""The parts of a node's start-up that need no node: the transport's bounds, the address check,
one node per SQLite file, and an SQLite path whose directory is missing."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from fastlane.domain.limits import DEFAULT_MAX_PAYLOAD_BYTES, MAX_CHECKPOINT_BYTES, PAYLOAD_CEILING_BYTES
from fastlane.errors import ConfigurationError
from fastlane.server import grpc_server
from fastlane.server.grpc_server import (
    MAX_CONCURRENT_RPCS,
    MESSAGE_ENVELOPE_BYTES,
    max_message_bytes,
    server_options,
)
from fastlane.storage import open_store
from fastlane.storage.sqlite.node_lock import NodeLock, lock_path

SECURITY = Path(__file__).resolve().parents[2] / "SECURITY.md"


@pytest.mark.parametrize(("payload", "message"), [
    (DEFAULT_MAX_PAYLOAD_BYTES, (1 << 20) + (64 << 10)),
    (PAYLOAD_CEILING_BYTES, (16 << 20) + (64 << 10)),
    (1_000, MAX_CHECKPOINT_BYTES + (64 << 10)),  # a worker's checkpoint must still fit
])
def test_the_largest_message_is_the_largest_valid_request(payload: int, message: int) -> None:
    assert max_message_bytes(payload) == message
    options = dict(server_options(payload))
    assert options["grpc.max_receive_message_length"] == message
    # No per-connection stream limit: a burst of calls on a new channel would have some reset.
    assert "grpc.max_concurrent_streams" not in options


def test_the_security_policy_states_the_bounds_the_server_sets() -> None:
    text = SECURITY.read_text()
    assert MESSAGE_ENVELOPE_BYTES == 64 << 10 and "64 KiB" in text
    assert f"{MAX_CONCURRENT_RPCS:,} calls" in text


def test_a_taken_address_is_refused_in_one_line_before_grpc_tries_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigurationError, match=f"cannot listen on {address}: the address is in use"):
            grpc_server._check_free(address)
    grpc_server._check_free(address)  # free again
    grpc_server._check_free("127.0.0.1:0")


def test_a_missing_directory_is_refused_not_made(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "dir"
    with pytest.raises(ConfigurationError, match=f"the directory {missing} does not exist; create it first"):
        open_store(f"sqlite:///{missing}/x.db")
    assert not missing.parent.exists()


def test_one_lock_per_file_naming_the_holder(tmp_path: Path) -> None:
    database = tmp_path / "x.db"
    url = f"sqlite:///{database}"
    first, second = NodeLock(database, url), NodeLock(database, url)
    first.acquire()
    try:
        assert lock_path(database) == tmp_path / "x.db.lock"
        with pytest.raises(ConfigurationError) as refused:
            second.acquire()
        assert str(refused.value) == (f"another fastlane node (pid {os.getpid()}) is using {url}: SQLite is for one "
                                      "node; use PostgreSQL for several")
        assert not second.held
    finally:
        first.release()
    second.acquire()  # released: the next node takes it
    second.release()


async def test_a_node_store_holds_the_file_until_closed_and_one_shot_stores_do_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    node = open_store(url, shard_count=4, node=True)
    await node.migrate()
    try:
        other = open_store(url, shard_count=4, node=True)
        with pytest.raises(ConfigurationError, match="another fastlane node"):
            await other.migrate()
        await other.close()
        one_shot = open_store(url, shard_count=4)  # fastlane migrate, tokens create --db
        assert await one_shot.migrate() == await node.migrate()
        await one_shot.close()
    finally:
        await node.close()
    again = open_store(url, shard_count=4, node=True)
    await again.migrate()
    await again.close()
