"""Driver exceptions, classified once at the store boundary: weather or a real error.

Every exception the database driver raises becomes a :class:`StorageUnavailable` (retryable: the
database is unreachable, restarting, overloaded, or a transaction lost a race it may win next
time) or a plain :class:`StorageError` (permanent: retrying the same statement fails the same
way). The stores raise the result ``from`` the driver's exception, so ``__cause__`` keeps it.

Only :class:`StorageUnavailable` is retried by the node's loops; an operator sees the rest.
"""

from __future__ import annotations

import sqlite3

import asyncpg

from fastlane.domain.errors import StorageError, StorageUnavailable

# -- PostgreSQL ------------------------------------------------------------------------------------

# SQLSTATE classes whose every condition is weather: 08 connection exception, 53 insufficient
# resources (too many connections, out of memory, disk full), 57 operator intervention (admin or
# crash shutdown, cannot connect now, idle_session_timeout, and 57014 query_canceled: a
# statement_timeout, or a cancel request after a client-side timeout), 58 system error (I/O).
_RETRYABLE_SQLSTATE_CLASSES = frozenset({"08", "53", "57", "58"})
_RETRYABLE_SQLSTATES = frozenset({
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "40003",  # statement_completion_unknown
    "55P03",  # lock_not_available: lock_timeout ran out (or NOWAIT)
    "25006",  # read_only_sql_transaction: connected to a standby during a failover
    # The rest of class 25 (invalid transaction state) is a bug; these two are the server
    # ending a session whose transaction outstayed a limit: the node's own
    # idle_in_transaction_session_timeout (it froze mid-transaction) and, should an operator
    # set one, PostgreSQL 17's transaction_timeout. The transaction is gone; a new one may work.
    "25P03",  # idle_in_transaction_session_timeout
    "25P04",  # transaction_timeout
})
# A statement that gave up waiting, while the database itself answered: lock_timeout, a deadlock
# the server broke, statement_timeout.
_GAVE_UP_WAITING = frozenset({"55P03", "40P01", "57014"})

# asyncpg reports a connection or pool that is gone through InterfaceError and
# InternalClientError with these words; the same classes also report caller mistakes (a wrong
# argument type, say), which are permanent.
_CLOSED_WORDS = ("closed", "closing", "connection lost", "not initialized", "terminated")

POSTGRES_DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)
"""What the PostgreSQL store wraps; anything else (a bug, a cancellation) passes through."""


def classify_postgres(error: BaseException, *, connection_closed: bool = False, doing: str = "") -> StorageError:
    """The storage error to raise ``from`` an asyncpg (or socket) exception.

    ``connection_closed`` says the connection the statement ran on turned out closed: whatever
    asyncpg raised then, the cause is the lost connection, so it is weather. ``doing`` names the
    step for the message ("connecting").
    """
    if _postgres_is_retryable(error) or connection_closed:
        return StorageUnavailable(f"PostgreSQL unavailable{_while(doing)}: {_describe(error)}")
    return StorageError(f"PostgreSQL error{_while(doing)}: {_describe(error)}")


def gave_up_waiting(error: BaseException | None) -> bool:
    """Whether ``error`` (a driver exception, e.g. a StorageError's ``__cause__``) is a statement
    that gave up waiting (``lock_timeout``, a deadlock broken by the server, ``statement_timeout``)
    rather than a database out of reach."""
    return isinstance(error, asyncpg.PostgresError) and getattr(error, "sqlstate", None) in _GAVE_UP_WAITING


def _postgres_is_retryable(error: BaseException) -> bool:
    # Refused, reset, unreachable; asyncpg's command_timeout, a pool acquire or a connect that
    # timed out (asyncio.TimeoutError is TimeoutError).
    if isinstance(error, OSError | TimeoutError):
        return True
    if isinstance(error, asyncpg.PostgresError):
        sqlstate = getattr(error, "sqlstate", None) or ""
        return sqlstate[:2] in _RETRYABLE_SQLSTATE_CLASSES or sqlstate in _RETRYABLE_SQLSTATES
    if isinstance(error, asyncpg.exceptions.OutdatedSchemaCacheError):
        return True  # a cached statement went stale after a migration: preparing it again works
    if isinstance(error, asyncpg.exceptions.TargetServerAttributeNotMatched):
        return True  # no server takes writes yet: mid-failover, until a standby is promoted
    if isinstance(error, asyncpg.exceptions.DataError | asyncpg.exceptions.ClientConfigurationError):
        return False  # a bad argument or setting (its message may quote the value: no word matching)
    if isinstance(error, asyncpg.InterfaceError | asyncpg.InternalClientError):
        message = str(error).lower()
        return any(words in message for words in _CLOSED_WORDS)
    return False


# -- SQLite ----------------------------------------------------------------------------------------

# Primary result codes (extended code & 0xff) that are weather: another process holds the lock,
# an I/O error, a full disk, a read-only file or mount, a file that cannot be opened right now, a
# WAL protocol race.
_SQLITE_RETRYABLE_CODES = frozenset({
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_PROTOCOL,
})
_SQLITE_RETRYABLE_WORDS = ("database is locked", "database table is locked", "busy", "disk i/o error",
                           "closed database", "connection closed", "unable to open database file",
                           "database or disk is full", "readonly database")

# The database's bad days: the file cannot be written until an operator acts (frees space, makes
# the file or its mount writable, repairs the disk). Still weather, retried until it passes, but
# said plainly, with the fix; the node reports NOT_SERVING meanwhile. By primary result code,
# then by words for errors without one (the file system's own OSError).
_SQLITE_WRITE_FAULTS = {
    sqlite3.SQLITE_FULL: "the disk holding {path} is full: free space on it; fastlane retries until writes succeed",
    sqlite3.SQLITE_READONLY: ("the database file {path} is read-only (its permissions, a read-only mount, or "
                              "the file was moved or replaced): make it writable; fastlane retries until writes "
                              "succeed"),
    sqlite3.SQLITE_IOERR: ("an I/O error on the disk holding {path}: check the disk and its file system; "
                           "fastlane retries until writes succeed"),
    sqlite3.SQLITE_CANTOPEN: ("cannot open the database file {path} or its -wal/-shm files: check that they and "
                              "their directory exist and are writable; fastlane retries until writes succeed"),
}
_WRITE_FAULT_ERRNOS = {28: sqlite3.SQLITE_FULL, 122: sqlite3.SQLITE_FULL,  # ENOSPC, EDQUOT
                       30: sqlite3.SQLITE_READONLY, 13: sqlite3.SQLITE_READONLY, 1: sqlite3.SQLITE_READONLY,
                       5: sqlite3.SQLITE_IOERR}  # EROFS, EACCES, EPERM; EIO

SQLITE_DRIVER_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, OSError)
"""What the SQLite store wraps; anything else (a bug, a cancellation) passes through."""


def classify_sqlite(error: BaseException, *, doing: str = "", path: str = "") -> StorageError:
    """The storage error to raise ``from`` an sqlite3 (or file system) exception; ``doing``
    names the step for the message ("opening '/var/lib/fastlane.db'"). With ``path`` (the
    database file), a full disk, a read-only file, an I/O error or a file that cannot be opened
    is said as such, with its fix (see :func:`sqlite_write_fault`)."""
    fault = sqlite_write_fault(error, path=path) if path else None
    if fault is not None:
        return StorageUnavailable(f"{fault}{_while(doing)} ({_describe(error)})")
    if _sqlite_is_retryable(error):
        return StorageUnavailable(f"SQLite unavailable{_while(doing)}: {_describe(error)}")
    return StorageError(f"SQLite error{_while(doing)}: {_describe(error)}")


def sqlite_write_fault(error: BaseException, *, path: str) -> str | None:
    """What keeps the database file at ``path`` from being written, with its fix, if ``error``
    says so (a full disk, a read-only file or mount, an I/O error, a file that cannot be opened);
    None for anything else (a lock taken by another process, a bug in a statement)."""
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        primary = code & 0xFF
    elif isinstance(error, OSError) and error.errno in _WRITE_FAULT_ERRNOS:
        primary = _WRITE_FAULT_ERRNOS[error.errno]
    else:
        message = str(error).lower()
        primary = (sqlite3.SQLITE_FULL if "database or disk is full" in message
                   else sqlite3.SQLITE_READONLY if "readonly database" in message
                   else sqlite3.SQLITE_IOERR if "disk i/o error" in message
                   else -1)
    template = _SQLITE_WRITE_FAULTS.get(primary)
    return None if template is None else template.format(path=path)


def _sqlite_is_retryable(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return True
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _SQLITE_RETRYABLE_CODES
    # No result code: a closed connection (ProgrammingError) or an error raised by the module itself.
    message = str(error).lower()
    return any(words in message for words in _SQLITE_RETRYABLE_WORDS)


def _while(doing: str) -> str:
    return f" while {doing}" if doing else ""


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
