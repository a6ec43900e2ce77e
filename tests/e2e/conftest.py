"""Real processes for end-to-end tests: a daemon (``fastlane serve``) and a recording worker.

Every process listens on 127.0.0.1, is bounded in time, and is stopped at teardown (SIGTERM,
then SIGKILL if it does not exit).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import orjson
import pytest

from fastlane.client import Client

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
STOP_TIMEOUT = 15.0

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Process:
    """A child process whose output goes to a log file, always stopped at teardown."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log_path = log_path
        self.env = env or _environment()
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)
        log.close()

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(STOP_TIMEOUT)

    def stop(self) -> int | None:
        if not self.popen or self.popen.poll() is not None:
            return self.popen.returncode if self.popen else None
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(STOP_TIMEOUT)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Daemon(Process):
    def __init__(self, db_url: str, log_path: Path, node_id: str = "node-1") -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        super().__init__(
            [sys.executable, "-m", "fastlane", "serve", "--db", db_url, "--listen", self.address,
             "--node-id", node_id, "--shards", "8"],
            log_path,
        )

    async def wait_ready(self, timeout: float = 30.0) -> None:
        async with Client(self.address) as client:
            try:
                await client.wait_ready(timeout)
            except Exception as error:
                raise AssertionError(f"daemon not ready: {error}\n{self.log_tail()}") from error


class Recorder(Process):
    """The recording worker and the runs it has received."""

    def __init__(self, address: str, record_path: Path, log_path: Path) -> None:
        self.record_path = record_path
        env = _environment()
        env["FASTLANE_RECORD_FILE"] = str(record_path)
        super().__init__(
            [sys.executable, "-m", "fastlane", "worker", "recording_worker:worker", "--server", address],
            log_path, env,
        )

    def received(self) -> list[dict]:
        if not self.record_path.exists():
            return []
        lines = self.record_path.read_bytes().splitlines()
        return [orjson.loads(line) for line in lines if line.strip()]

    def received_for(self, job_id: str) -> list[dict]:
        return [entry for entry in self.received() if entry["job_id"] == job_id]


async def wait_for(condition, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``condition`` (sync or async) until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


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
