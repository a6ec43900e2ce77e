"""A node's start and end with real processes: one node per SQLite file, ports bound before the
database is touched, and a clean exit on SIGTERM whatever the node is waiting for."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from e2e_support import Daemon, Process, free_port

pytestmark = pytest.mark.e2e

RAW_GRPC_LINE = "add_port.cc"  # what gRPC's C core prints when a bind fails


def serve(db_url: str, listen: str, log_path: Path) -> Process:
    return Process([sys.executable, "-m", "fastlane", "serve", "--db", db_url, "--listen", listen,
                    "--metrics", f"127.0.0.1:{free_port()}", "--shards", "4"], log_path)


async def test_a_second_node_on_one_sqlite_file_refuses_to_start(tmp_path: Path, processes: list[Process]) -> None:
    url = f"sqlite:///{tmp_path}/one.db"
    first = Daemon(url, tmp_path / "first.log", shards=4)
    first.start()
    processes.append(first)
    await first.wait_ready()
    second = Daemon(url, tmp_path / "second.log", node_id="node-2", shards=4)
    second.start()
    processes.append(second)
    assert second.popen is not None
    assert second.popen.wait(30) == 1, second.log_tail()
    log = second.log_path.read_text()
    assert (f"another fastlane node (pid {first.pid}) is using {url}: SQLite is for one node; use PostgreSQL "
            "for several") in log, log
    assert "Traceback" not in log, log
    assert first.popen is not None and first.popen.poll() is None
    await first.wait_ready(5)
    # Once the first is gone (even killed), the file is free again.
    first.kill()
    third = Daemon(url, tmp_path / "third.log", node_id="node-3", shards=4)
    third.start()
    processes.append(third)
    await third.wait_ready()


def test_a_taken_port_fails_before_the_database_is_made(tmp_path: Path, processes: list[Process]) -> None:
    database = tmp_path / "x.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        node = serve(f"sqlite:///{database}", listen, tmp_path / "node.log")
        node.start()
        processes.append(node)
        assert node.popen is not None
        assert node.popen.wait(30) == 1, node.log_tail()
    log = node.log_path.read_text()
    assert f"cannot listen on {listen}: the address is in use" in log, log
    assert RAW_GRPC_LINE not in log and "Traceback" not in log, log
    assert not database.exists() and not Path(f"{database}.lock").exists()


def test_sigterm_while_the_database_cannot_be_opened_exits_cleanly(tmp_path: Path, processes: list[Process]) -> None:
    """The node retries a file it cannot open (here: a regular file where its directory should
    be) for a minute; SIGTERM meanwhile once left aiosqlite's thread printing "Event loop is
    closed" tracebacks after the loop was gone."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    for attempt in range(5):
        log_path = tmp_path / f"node-{attempt}.log"
        node = serve(f"sqlite:///{blocker}/x.db", f"127.0.0.1:{free_port()}", log_path)
        node.start()
        processes.append(node)
        assert node.popen is not None
        deadline = time.monotonic() + 30
        while "cannot reach the database yet" not in log_path.read_text():
            assert node.popen.poll() is None, node.log_tail()
            assert time.monotonic() < deadline, node.log_tail()
            time.sleep(0.05)
        time.sleep(0.05 * attempt)  # land at different points of the retry loop
        node.popen.send_signal(signal.SIGTERM)
        assert node.popen.wait(15) in (0, 1), node.log_tail()
        log = log_path.read_text()
        assert "Traceback" not in log and "Event loop is closed" not in log, log
