"""One node per SQLite file: an exclusive advisory lock on ``<db>.lock``, held for the node's life.

SQLite serialises writers, so two nodes on one file would run without an error, as a two-node
cluster on a database made for one (no change notifications between them, each judging leases
on its own host's clock). A node takes this lock when it first opens the file and keeps it until
its store is closed; a second node fails at once and says which process holds the file. One-shot
commands (``fastlane migrate``, ``tokens create --db``) take no lock: they may run beside a node.

``flock`` locks belong to the open file: the kernel drops one when its holder exits, however it
exits, so a crashed node leaves no stale lock behind (the file itself stays, and is reused).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from fastlane.errors import ConfigurationError


def lock_path(database: Path) -> Path:
    """The lock file beside ``database``."""
    return database.with_name(database.name + ".lock")


class NodeLock:
    """The exclusive lock of one node on one SQLite file."""

    def __init__(self, database: Path, url: str) -> None:
        self.path = lock_path(database)
        self._url = url
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (a no-op while held).

        Raises:
            ConfigurationError: Another node holds it; the message names its process.
            OSError: The lock file cannot be made or opened (the caller classifies it).
        """
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise ConfigurationError(
                f"another fastlane node ({who}) is using {self._url}: SQLite is for one node; use PostgreSQL "
                "for several"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # the holder's pid, for the next one's message only
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the lock


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or "0") or None
    return None
