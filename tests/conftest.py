"""Shared fixtures: database URLs for the SQLite and PostgreSQL stores.

PostgreSQL: set FASTLANE_TEST_PG_DSN (a postgresql:// URL with rights to
CREATE/DROP DATABASE) to use an existing cluster; otherwise one throwaway
cluster is started for the whole session and removed at its end. Each test
that asks for ``pg_dsn`` gets a fresh, empty database of its own.
"""

from __future__ import annotations

import functools
import signal
import uuid

import pytest

from fastlane.storage import open_store
from fastlane.testing.postgres import (
    ThrowawayPostgres,
    create_database,
    drop_database,
    dsn_from_env,
)


@pytest.fixture(autouse=True)
def _stop_on_sigterm_as_on_ctrl_c():
    """A run stopped with SIGTERM (a CI time limit, ``kill``) ends as Ctrl-C ends it: fixtures are
    torn down, so the throwaway PostgreSQL cluster is stopped instead of left running. Set again
    before every test: a test that runs a node in-process installs its own handler, and closing
    its loop restores the default (die at once)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@pytest.fixture(scope="session")
def pg_admin_dsn():
    """DSN of a cluster where tests may create and drop databases."""
    dsn = dsn_from_env()
    if dsn:
        yield dsn
        return
    cluster = ThrowawayPostgres()
    try:
        cluster.start()
        yield cluster.dsn
    finally:
        cluster.stop()


@pytest.fixture
async def pg_dsn(pg_admin_dsn):
    """DSN of a fresh, empty database ``fl_test_<hex>``, dropped (FORCE) after the test."""
    name = f"fl_test_{uuid.uuid4().hex}"
    dsn = await create_database(pg_admin_dsn, name)
    try:
        yield dsn
    finally:
        await drop_database(pg_admin_dsn, name)


@pytest.fixture
def sqlite_url(tmp_path):
    """URL of a SQLite database file in the test's temporary directory."""
    yield f"sqlite:///{tmp_path}/fastlane.db"


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def db_url(request):
    """Store URL; the test runs once per backend. PostgreSQL is only set up for its param."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    if request.param == "postgres":
        return request.getfixturevalue("pg_dsn")
    raise ValueError(f"unknown db_url backend {request.param!r}")


@pytest.fixture
def make_store(db_url):
    """A factory of stores on the test's database, once per backend: the contract suite
    (``tests/contract``) makes every store it tests through it, so a backend that can give a
    store for a fresh database (a URL :func:`fastlane.storage.open_store` knows, or any callable
    taking ``shard_count`` and returning a :class:`~fastlane.storage.Store`) runs the whole suite
    by adding a parameter to ``db_url``."""
    return functools.partial(open_store, db_url)
