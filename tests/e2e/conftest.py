"""Real processes for end-to-end tests: a daemon (``fastlane serve``) and a recording worker.

Every process listens on 127.0.0.1, is bounded in time, and is stopped at teardown (SIGTERM,
then SIGKILL if it does not exit).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import Daemon, Process, Recorder

from fastlane.client import Client
from fastlane.testing.processes import free_port  # noqa: F401


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()


@pytest.fixture
async def daemon(db_url: str, tmp_path: Path, processes: list[Process]) -> Daemon:
    node = Daemon(db_url, tmp_path / "daemon.log")
    node.start()
    processes.append(node)
    await node.wait_ready()
    return node


@pytest.fixture
async def recorder(daemon: Daemon, tmp_path: Path, processes: list[Process]) -> Recorder:
    worker = Recorder(daemon.address, tmp_path / "received.jsonl", tmp_path / "worker.log")
    worker.start()
    processes.append(worker)
    return worker


@pytest.fixture
async def client(daemon: Daemon):  # type: ignore[no-untyped-def]
    async with Client(daemon.address) as connected:
        yield connected


