"""Fixtures of the browser tests: a real node (``fastlane serve --auth --console``) with tokens,
a real worker process, and headless Chromium; all on 127.0.0.1, all stopped at the end."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from browser_support import SCREENSHOTS_ENV, ConsoleNode, missing, start_chromium
from selenium import webdriver

from fastlane.auth.issuing import issue_token
from fastlane.domain.access import Role
from fastlane.storage import open_store
from fastlane.testing.processes import Daemon, WorkerProcess, child_environment, free_port

HERE = Path(__file__).parent


@pytest.fixture
async def console_node(tmp_path: Path) -> AsyncIterator[ConsoleNode]:
    """A node on SQLite requiring tokens, with its console, and a worker of tenant acme."""
    db_url = f"sqlite:///{tmp_path}/console.db"
    store = open_store(db_url, shard_count=8)
    await store.migrate()
    secrets = {}
    for who, tenant, role in (("alice", "acme", Role.CLIENT), ("victor", "acme", Role.VIEWER),
                              ("olga", "other", Role.CLIENT), ("acme-worker", "acme", Role.WORKER),
                              ("admin", "ops", Role.ADMIN)):
        _, secret = await issue_token(store, tenant=tenant, role=role, name=who)
        secrets[who] = str(secret)
    await store.close()
    console_address = f"127.0.0.1:{free_port()}"
    node = Daemon(db_url, tmp_path / "node.log", extra_args=["--auth", "--console", console_address],
                  client_options={"token": secrets["admin"]})
    worker = WorkerProcess("console_worker:worker", [node.address], tmp_path / "worker.log",
                           env=child_environment(HERE, FASTLANE_TOKEN=secrets["acme-worker"]))
    try:
        node.start()
        await node.wait_ready()
        worker.start()
        yield ConsoleNode(url=f"http://{console_address}", secrets=secrets, api=node.address)
    finally:
        worker.stop()
        node.stop()


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    problem = missing()
    if problem is not None:
        pytest.fail(problem)  # not a skip: the suite's set-up installs them
    driver = start_chromium(tmp_path / "chromium-profile")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshots() -> Path:
    """Where screenshots go: FASTLANE_SCREENSHOTS (the README's, by `make screenshots`), else a temporary folder."""
    target = Path(os.environ.get(SCREENSHOTS_ENV) or tempfile.mkdtemp(prefix="console-screenshots-"))
    target.mkdir(parents=True, exist_ok=True)
    return target
