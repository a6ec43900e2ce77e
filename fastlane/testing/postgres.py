"""A throwaway PostgreSQL cluster: the one the test suite and the benchmarks run against.

No pytest dependency: usable from a conftest.py, from benchmarks and from a one-off script::

    with ThrowawayPostgres() as pg:
        print(pg.dsn)

It needs PostgreSQL's server binaries (``initdb``, ``pg_ctl``; ``pg_basebackup`` for a standby):
on ``PATH``, or in Debian's ``/usr/lib/postgresql/<version>/bin``, the newest found. A suite that
has a server of its own names it in ``FASTLANE_TEST_PG_DSN`` (:func:`dsn_from_env`) instead.

The cluster lives in a fresh temporary directory (data directory, unix socket
and server log) and listens on a free TCP port on 127.0.0.1 with trust
authentication and durability switched off by default (``DURABLE_SETTINGS`` turn it on). ``stop()`` kills it with
``pg_ctl stop -m immediate`` and deletes the directory; an atexit hook does the
same if the caller never gets that far.

PostgreSQL refuses to run as root, so when this process is root every server
binary is run as the ``postgres`` system user through ``runuser``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any, Self

from fastlane.testing.processes import free_port

ENV_DSN = "FASTLANE_TEST_PG_DSN"
SERVER_USER = "postgres"

# Durability is off by default: a crash of this throwaway server loses nothing anyone keeps, and
# the benchmark then measures fastlane's work rather than the disk's flushes. DURABLE_SETTINGS
# (``fastlane bench --durable``) are PostgreSQL's own defaults: every commit waits for its WAL to
# reach the disk, and a page's first change after a checkpoint is logged whole.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
DURABLE_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}

_LOG_TAIL_LINES = 40
_START_ATTEMPTS = 3  # the free port can be taken between probing and binding


class PostgresClusterError(RuntimeError):
    """Setting up or tearing down the throwaway cluster failed."""


def dsn_from_env() -> str | None:
    """The DSN of an externally managed cluster, if the environment names one."""
    return os.environ.get(ENV_DSN)


_PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def adopt_orphans() -> Iterator[None]:
    """Linux: make this process a child subreaper while the body runs.

    ``pg_ctl start`` daemonises the postmaster; once pg_ctl exits the postmaster
    is reparented to the nearest subreaper, normally PID 1. If PID 1 does not
    reap (minimal container init, no init at all), every stopped cluster would
    then linger as a ``<defunct>`` postgres process. Being the subreaper while
    pg_ctl runs makes the postmaster our child, so ``stop()`` can reap it. The
    flag only matters at the moment of reparenting, so it is switched off again.
    """
    libc: ctypes.CDLL | None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            libc = None
    except (OSError, AttributeError):
        libc = None
    try:
        yield
    finally:
        if libc is not None:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def reap(pid: int, timeout: float = 10.0) -> None:
    """Collect ``pid``'s exit status if it is our child (see :func:`adopt_orphans`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # not our child (no subreaper support) or already reaped
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _tail(path: str, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as exc:
        return f"<no server log: {exc}>"


def _find_bin_dir() -> str | None:
    """None when initdb is on PATH; else Debian's versioned directory, newest first."""
    if shutil.which("initdb"):
        return None
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]), reverse=True)
    return os.path.dirname(candidates[0]) if candidates else None


class ThrowawayPostgres:
    """A private PostgreSQL cluster in a temporary directory."""

    def __init__(
        self, *, bin_dir: str | None = None, start_timeout: int = 60, settings: dict[str, str] | None = None
    ) -> None:
        """``settings`` are server settings (``-c name=value``) over the defaults."""
        self._bin_dir = bin_dir or _find_bin_dir()
        self._start_timeout = start_timeout
        self._settings = dict(settings or {})
        self._as_root = os.geteuid() == 0
        self.base_dir: str | None = None
        self.port: int | None = None
        self.dsn: str | None = None
        self._running = False
        self._postmaster_pid: int | None = None

    @property
    def durability(self) -> dict[str, str]:
        """The server's fsync, synchronous_commit and full_page_writes, as it is started with."""
        return {name: self._settings.get(name, value) for name, value in FAST_SETTINGS.items()}

    # -- paths -------------------------------------------------------------

    @property
    def data_dir(self) -> str:
        assert self.base_dir is not None
        return os.path.join(self.base_dir, "data")

    @property
    def log_path(self) -> str:
        assert self.base_dir is not None
        return os.path.join(self.base_dir, "log")

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines) if self.base_dir else ""

    # -- running commands --------------------------------------------------

    def _argv(self, *args: str) -> list[str]:
        exe = os.path.join(self._bin_dir, args[0]) if self._bin_dir else args[0]
        argv = [exe, *args[1:]]
        if self._as_root:
            argv = ["runuser", "-u", SERVER_USER, "--", *argv]
        return argv

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = self._argv(*args)
        # cwd: the server user may not be able to enter the caller's directory.
        try:
            return subprocess.run(
                argv,
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=True,
            )
        except subprocess.CalledProcessError as exc:
            raise PostgresClusterError(
                self._describe(argv, f"exit status {exc.returncode}", exc.stdout, exc.stderr)
            ) from None
        except subprocess.TimeoutExpired as exc:
            raise PostgresClusterError(
                self._describe(argv, f"timed out after {timeout}s", exc.stdout, exc.stderr)
            ) from None
        except OSError as exc:
            raise PostgresClusterError(self._describe(argv, str(exc), "", "")) from None

    def _describe(self, argv: list[str], what: str, stdout: str | bytes | None, stderr: str | bytes | None) -> str:
        def text(v: str | bytes | None) -> str:
            if isinstance(v, bytes):
                v = v.decode(errors="replace")
            return (v or "").strip() or "<empty>"

        return (
            f"command failed ({what}): {subprocess.list2cmdline(argv)}\n"
            f"--- stdout ---\n{text(stdout)}\n"
            f"--- stderr ---\n{text(stderr)}\n"
            f"--- server log tail ({self.log_path if self.base_dir else '-'}) ---\n"
            f"{self.log_tail() or '<none>'}"
        )

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> Self:
        if self._running:
            return self
        self.base_dir = tempfile.mkdtemp(prefix="fastlane-pg-")
        atexit.register(self.stop)
        try:
            if self._as_root:
                shutil.chown(self.base_dir, user=SERVER_USER, group=SERVER_USER)
            os.chmod(self.base_dir, 0o700)
            self._create_data_dir()
            for attempt in range(1, _START_ATTEMPTS + 1):
                port = free_port()
                options = (
                    f"-c listen_addresses=127.0.0.1 -p {port} -k {self.base_dir} "
                    + "".join(f"-c {name}={value} " for name, value in FAST_SETTINGS.items())
                    + "-c max_connections=300 -c shared_buffers=128MB"
                )
                # Later -c options win over earlier ones.
                options += "".join(f" -c {name}={value}" for name, value in self._settings.items())
                try:
                    with adopt_orphans():
                        self._run(
                            "pg_ctl", "-D", self.data_dir, "-o", options, "-l", self.log_path,
                            "-w", "-t", str(self._start_timeout), "start",
                            timeout=self._start_timeout + 30,
                        )
                    self._postmaster_pid = self._read_postmaster_pid()
                    break
                except PostgresClusterError:
                    self._kill_postmaster()  # a half-started server must not linger
                    if attempt == _START_ATTEMPTS or "could not bind" not in self.log_tail():
                        raise
            self.port = port
            self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
            self._running = True
        except BaseException:
            self.stop()
            raise
        return self

    def _create_data_dir(self) -> None:
        self._run(
            "initdb", "-D", self.data_dir, "-U", "postgres", "--auth=trust",
            "--no-sync", "-E", "UTF8", "--locale=C",
        )

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m MODE``: the server goes down and comes back with the same options."""
        old = self._read_postmaster_pid()
        with adopt_orphans():  # the new postmaster becomes our child, so stop() can reap it
            self._run("pg_ctl", "-D", self.data_dir, "-m", mode, "-l", self.log_path, "-w", "-t", "60", "restart",
                      timeout=90)
        if old is not None:
            reap(old, timeout=5)
        self._postmaster_pid = self._read_postmaster_pid()

    def promote(self) -> None:
        """``pg_ctl promote``: a standby becomes a primary (on a new timeline); waits until it is."""
        self._run("pg_ctl", "-D", self.data_dir, "-w", "-t", str(self._start_timeout), "promote",
                  timeout=self._start_timeout + 30)

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: the server dies at once, as on a crash; the data
        directory stays until :meth:`stop`."""
        old = self._read_postmaster_pid()
        self._run("pg_ctl", "-D", self.data_dir, "-m", "immediate", "-w", "stop", timeout=60)
        if old is not None:
            reap(old, timeout=5)
        self._postmaster_pid = None

    def stop(self) -> None:
        """Stop the server and remove the directory. Safe to call repeatedly."""
        atexit.unregister(self.stop)
        if self.base_dir is None:
            return
        try:
            if os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
                try:
                    self._run("pg_ctl", "-D", self.data_dir, "-m", "immediate", "-w", "stop", timeout=60)
                except PostgresClusterError:
                    self._kill_postmaster()  # already stopped, or pg_ctl broken
            if self._postmaster_pid is not None:
                reap(self._postmaster_pid)
        finally:
            self._postmaster_pid = None
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
            self.dsn = None
            self.port = None
            self._running = False

    def _read_postmaster_pid(self) -> int | None:
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid")) as f:
                return int(f.readline().strip())
        except (OSError, ValueError):
            return None

    def _kill_postmaster(self) -> None:
        """Last resort: SIGQUIT (immediate shutdown) the postmaster this cluster started."""
        pid = self._read_postmaster_pid() or self._postmaster_pid
        if pid is None:
            return
        reap(pid, timeout=0)  # a reaped-and-reused pid must not be signalled
        try:
            os.kill(pid, signal.SIGQUIT)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            reap(pid, timeout=0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            if _is_zombie(pid):
                return
            time.sleep(0.05)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap(pid)

    @property
    def running(self) -> bool:
        return self._running

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


REPLICATION_SETTINGS = {"wal_level": "replica", "max_wal_senders": "5", "hot_standby": "on"}


class StandbyPostgres(ThrowawayPostgres):
    """A streaming standby of ``primary``: its data directory is a ``pg_basebackup`` of it, and it
    replays the primary's WAL as it comes. Give the primary ``synchronous_standby_names='*'``
    (see :func:`replicated_pair`) and every commit waits until this standby has it."""

    def __init__(self, primary: ThrowawayPostgres, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._primary = primary

    def _create_data_dir(self) -> None:
        self._run(
            "pg_basebackup", "-D", self.data_dir, "-h", "127.0.0.1", "-p", str(self._primary.port),
            "-U", "postgres", "--write-recovery-conf", "--wal-method=stream", "--no-sync",
            "--checkpoint=fast",
        )


def replicated_pair(*, synchronous: bool = True) -> tuple[ThrowawayPostgres, StandbyPostgres]:
    """A primary and its streaming standby, both started; stop both when done. With
    ``synchronous``, a commit on the primary returns only once the standby has flushed it
    (``synchronous_commit=on``), so a failover loses nothing acknowledged."""
    primary_settings = dict(REPLICATION_SETTINGS)
    if synchronous:
        primary_settings.update(synchronous_standby_names="'*'", synchronous_commit="on")
    primary = ThrowawayPostgres(settings=primary_settings).start()
    try:
        # A quick reconnection after the primary restarts: a synchronous primary commits nothing
        # while its standby is away (the default waits 5 s between tries).
        settings = {**REPLICATION_SETTINGS, "cluster_name": "standby", "wal_retrieve_retry_interval": "100ms"}
        standby = StandbyPostgres(primary, settings=settings).start()
    except BaseException:
        primary.stop()
        raise
    return primary, standby


def multi_host_dsn(dsn: str, *others: ThrowawayPostgres) -> str:
    """``dsn`` (a postgresql:// URL of one server) naming the servers ``others`` too, in that
    order, and asking for a server that accepts writes (``target_session_attrs=read-write``)."""
    parts = urllib.parse.urlsplit(dsn)
    hosts = ",".join([parts.netloc.rpartition("@")[2], *(f"127.0.0.1:{other.port}" for other in others)])
    user = parts.netloc.rpartition("@")[0]
    query = urllib.parse.urlencode([*urllib.parse.parse_qsl(parts.query), ("target_session_attrs", "read-write")])
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{hosts}" if user else hosts, query=query))


# -- database helpers (asyncpg) ----------------------------------------------


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def dsn_for_database(dsn: str, dbname: str) -> str:
    """``dsn`` (a postgresql:// URL) with its database replaced by ``dbname``."""
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(dbname, safe="")))


async def create_database(admin_dsn: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` through ``admin_dsn``; return a DSN pointing at it."""
    import asyncpg

    sql = f"CREATE DATABASE {_quote_ident(name)}"
    if template is not None:
        sql += f" TEMPLATE {_quote_ident(template)}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()
    return dsn_for_database(admin_dsn, name)


async def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` if it exists, terminating any sessions still on it."""
    import asyncpg

    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")
    finally:
        await conn.close()
