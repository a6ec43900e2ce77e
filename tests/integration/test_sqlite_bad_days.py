"""SQLite's bad days: a full disk and a read-only database file, made real on a small tmpfs.

While writes fail, the store says why and how to fix it (StorageUnavailable, retried), the node
reports NOT_SERVING with one ERROR line, API writes answer UNAVAILABLE naming the cause; nothing
acknowledged before is lost, and once the cause is gone the node serves again by itself and the
runs due meanwhile fire (late).

Tests run as root, which ignores file permissions, so "read-only" is the file's immutable flag
(``chattr +i``, which root obeys): a connection opened on such a file can only read. The tmpfs is
mounted by the test; without the privilege to mount one, the tests skip (the classification is
also covered in tests/unit/test_driver_errors.py with the errors sqlite3 raises).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastlane.client import Client
from fastlane.domain.errors import StorageUnavailable
from fastlane.domain.models import JobSpec, JobState, RunState, Schedule
from fastlane.errors import RemoteUnavailable
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.storage.sqlite import SQLiteStore
from fastlane.testing import until
from fastlane.testing.processes import free_port
from fastlane.worker import RunContext, Worker

WAIT = 20.0  # seconds: the bound of every wait below (a lease TTL is 10 s)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs of its own (16 MiB), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        for name in os.listdir(disk):
            subprocess.run(["chattr", "-i", str(disk / name)], capture_output=True, check=False)
        if subprocess.run(["umount", str(disk)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Fill the file system of ``disk`` to the last block; the file to delete to free it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler


def immutable(path: Path, on: bool) -> None:
    """Set or clear the immutable flag, which makes a file read-only even for root."""
    result = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot set the immutable flag here: {result.stderr.strip()}")


def truncate_wal(database: Path) -> None:
    """Checkpoint the WAL and cut it to nothing, so that every later write must grow a file."""
    connection = sqlite3.connect(database, timeout=10)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()


# -- the store ----------------------------------------------------------------------------------


async def test_a_read_only_database_file_is_unavailable_named_and_writable_again_without_a_restart(small_disk):
    database = small_disk / "fastlane.db"
    store = SQLiteStore(f"sqlite:///{database}", shard_count=4)
    await store.migrate()
    try:
        kept, _ = await store.jobs.create_job(JobSpec(name="before", job_type="echo", schedule=Schedule.interval(
            timedelta(hours=1))))
        await store.close()  # the next write opens the file again, now read-only
        immutable(database, True)
        try:
            with pytest.raises(StorageUnavailable) as refused:
                await store.jobs.create_job(JobSpec(name="during", job_type="echo", schedule=Schedule.now()))
            assert f"the database file {database} is read-only" in str(refused.value)
            assert "make it writable" in str(refused.value)
            assert store.write_fault is not None and "read-only" in store.write_fault
            assert (await store.jobs.get_job("default", kept.job_id)).spec.name == "before"  # reads go on
        finally:
            immutable(database, False)
        # The same store, no restart: its writer was opened read-only and is opened again.
        created, _ = await store.jobs.create_job(JobSpec(name="after", job_type="echo", schedule=Schedule.now()))
        assert store.write_fault is None
        assert (await store.jobs.get_job("default", created.job_id)).spec.name == "after"
    finally:
        await store.close()


async def test_a_full_disk_is_unavailable_named_and_writable_again_once_space_is_freed(small_disk):
    database = small_disk / "fastlane.db"
    store = SQLiteStore(f"sqlite:///{database}", shard_count=4)
    await store.migrate()
    try:
        truncate_wal(database)
        filler = fill(small_disk)
        big = JobSpec(name="during", job_type="echo", schedule=Schedule.now(), payload=b"x" * 200_000)
        with pytest.raises(StorageUnavailable) as refused:
            await store.jobs.create_job(big)
        assert f"the disk holding {database} is full: free space on it" in str(refused.value)
        assert store.write_fault is not None and "is full" in store.write_fault
        filler.unlink()
        created, _ = await store.jobs.create_job(big)
        assert store.write_fault is None
        assert (await store.jobs.get_job("default", created.job_id)).spec.payload == big.payload
    finally:
        await store.close()


# -- a node -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_node(database: Path) -> AsyncIterator[Node]:
    settings = Settings(db_url=f"sqlite:///{database}", listen=f"127.0.0.1:{free_port()}", node_id="node-a",
                        shard_count=4)
    node = Node(settings)
    task = asyncio.create_task(node.run(), name="test-node")
    try:
        await asyncio.wait_for(node.ready.wait(), WAIT)
        yield node
    finally:
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, WAIT)


@contextlib.asynccontextmanager
async def echo_worker(address: str, ran: list[str]) -> AsyncIterator[Worker]:
    worker = Worker(address, drain_timeout=1.0)

    @worker.handler("echo")
    async def echo(ctx: RunContext) -> None:
        ran.append(ctx.job_id)

    task = asyncio.create_task(worker.run(), name="test-worker")
    try:
        yield worker
    finally:
        try:
            await asyncio.wait_for(worker.stop(), WAIT)
        except TimeoutError:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), WAIT)


async def health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return int(answer.status)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def succeeded(client: Client, job_id: str) -> bool:
    runs = (await client.list_runs(job_id=job_id)).items
    return any(run.state == RunState.SUCCEEDED for run in runs)


async def test_a_node_on_a_full_then_read_only_disk_says_not_serving_and_recovers_by_itself(small_disk, caplog):
    caplog.set_level(logging.INFO, logger="fastlane.node")
    database = small_disk / "fastlane.db"
    ran: list[str] = []
    async with running_node(database) as node:
        address = f"127.0.0.1:{node.port}"
        registry = node.metrics.registry
        async with Client(address, timeout=5) as client, echo_worker(address, ran):
            # Acknowledged before the fault: a run that succeeded.
            before = await client.create("before", "echo", Schedule.now())
            await until(lambda: succeeded(client, before.job_id), WAIT, "the first run to succeed")
            assert await health(address) == SERVING

            # A job due while the disk is full; then the disk fills up.
            due = await client.create("due", "echo", Schedule.at_instant(_at(2)))
            truncate_wal(database)
            filler = fill(small_disk)
            await until(lambda: _not_serving(address), WAIT, "NOT_SERVING on a full disk")
            with pytest.raises(RemoteUnavailable) as refused:
                await client.create("refused", "echo", Schedule.now(), payload=b"x" * 200_000)
            assert "is full: free space on it" in refused.value.details
            assert registry.get_sample_value("fastlane_database_writable") == 0

            # Meanwhile the file turns read-only too; then the space comes back.
            immutable(database, True)
            filler.unlink()
            await until(lambda: node_fault_says(caplog, "is read-only"), WAIT, "the read-only file to be named")
            assert await health(address) == NOT_SERVING
            with pytest.raises(RemoteUnavailable) as refused:
                await client.create("refused", "echo", Schedule.now())
            assert "is read-only" in refused.value.details

            immutable(database, False)
            await until(lambda: _serving(address), WAIT, "SERVING once the file is writable again")
            assert registry.get_sample_value("fastlane_database_writable") == 1
            # Nothing acknowledged was lost, and the node takes new jobs which fire.
            assert await succeeded(client, before.job_id)
            after = await client.create("after", "echo", Schedule.now())
            await until(lambda: succeeded(client, after.job_id), WAIT, "a job created after recovery to run")
            await until(lambda: succeeded(client, due.job_id), WAIT, "the run due during the fault to fire, late")
            assert all(job.state != JobState.ERRORED for job in (await client.list_jobs()).items)  # none set aside

    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name == "fastlane.node"]
    # One line per cause (full, then read-only), not one per retry.
    assert len(errors) == 2, errors
    assert "is full" in errors[0] and "is read-only" in errors[1]


def node_fault_says(caplog: pytest.LogCaptureFixture, words: str) -> bool:
    return any(r.levelno >= logging.ERROR and words in r.getMessage() for r in caplog.records)


async def _serving(address: str) -> bool:
    return await health(address) == SERVING


async def _not_serving(address: str) -> bool:
    return await health(address) == NOT_SERVING


def _at(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)
