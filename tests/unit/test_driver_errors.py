"""Driver exceptions are classified once: weather (StorageUnavailable) or a permanent StorageError."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from fastlane.domain.errors import StorageError, StorageUnavailable
from fastlane.storage.driver_errors import (
    POSTGRES_DRIVER_ERRORS,
    SQLITE_DRIVER_ERRORS,
    classify_postgres,
    classify_sqlite,
    gave_up_waiting,
    sqlite_write_fault,
)

# -- PostgreSQL ----------------------------------------------------------------------------------

POSTGRES_WEATHER = [
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.exceptions.ConnectionFailureError("connection failure"),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.CrashShutdownError("terminating connection because of crash of another server process"),
    asyncpg.CannotConnectNowError("the database system is shutting down"),
    asyncpg.CannotConnectNowError("the database system is starting up"),
    asyncpg.TooManyConnectionsError("sorry, too many clients already"),
    asyncpg.SerializationError("could not serialize access due to concurrent update"),
    asyncpg.DeadlockDetectedError("deadlock detected"),
    asyncpg.exceptions.LockNotAvailableError("could not obtain lock on row"),
    asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
    asyncpg.exceptions.LockNotAvailableError("canceling statement due to lock timeout"),
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError(
        "terminating connection due to idle-in-transaction timeout"
    ),
    asyncpg.exceptions.TransactionTimeoutError("terminating connection due to transaction timeout"),
    asyncpg.exceptions.IdleSessionTimeoutError("terminating connection due to idle-session timeout"),
    asyncpg.exceptions.ReadOnlySQLTransactionError("cannot execute UPDATE in a read-only transaction"),
    asyncpg.exceptions.DiskFullError("could not extend file: No space left on device"),
    asyncpg.InterfaceError("pool is closed"),
    asyncpg.InterfaceError("pool is closing"),
    asyncpg.InterfaceError("connection is closed"),
    asyncpg.InterfaceError("cannot perform operation: connection is closed"),
    asyncpg.InterfaceError("cannot call Transaction.__aexit__(): the underlying connection is closed"),
    asyncpg.InternalClientError("cannot switch to state 15; connection is closed"),
    asyncpg.exceptions.OutdatedSchemaCacheError("cached statement plan is invalid due to a database schema change"),
    ConnectionResetError(104, "Connection reset by peer"),
    ConnectionRefusedError(111, "Connection refused"),
    OSError(113, "No route to host"),
    TimeoutError(),
    asyncio.TimeoutError(),  # asyncpg's command_timeout, a pool acquire or connect that timed out
    # No server takes writes (target_session_attrs=read-write) until a standby is promoted.
    asyncpg.exceptions.TargetServerAttributeNotMatched('None of the hosts match the target attribute requirement '
                                                      '<SessionAttribute.read_write: "read-write">'),
]

POSTGRES_PERMANENT = [
    asyncpg.UndefinedTableError('relation "jobs" does not exist'),
    asyncpg.exceptions.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00'),
    asyncpg.exceptions.UntranslatableCharacterError("unsupported Unicode escape sequence"),
    asyncpg.CheckViolationError('new row for relation "jobs" violates check constraint "jobs_priority"'),
    asyncpg.UniqueViolationError("duplicate key value violates unique constraint"),
    asyncpg.exceptions.InvalidPasswordError('password authentication failed for user "fastlane"'),
    asyncpg.exceptions.InternalServerError("unexpected internal error"),
    asyncpg.exceptions.DataError("invalid input for query argument $1: 'closed' (expected int, got str)"),
    asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
    asyncpg.InternalClientError("no binary format encoder for type foo"),
    # Class 25 is weather only where the server ended a transaction that outstayed a limit.
    asyncpg.exceptions.ActiveSQLTransactionError("CREATE INDEX CONCURRENTLY cannot run inside a transaction block"),
    asyncpg.exceptions.InFailedSQLTransactionError("current transaction is aborted"),
]


@pytest.mark.parametrize("error", POSTGRES_WEATHER, ids=lambda error: f"{type(error).__name__}:{error}")
def test_postgres_connection_trouble_is_weather(error: BaseException) -> None:
    assert isinstance(error, POSTGRES_DRIVER_ERRORS)
    assert isinstance(classify_postgres(error), StorageUnavailable)


@pytest.mark.parametrize("error", POSTGRES_PERMANENT, ids=lambda error: f"{type(error).__name__}:{error}")
def test_postgres_errors_in_the_statement_or_its_data_are_permanent(error: BaseException) -> None:
    assert isinstance(error, POSTGRES_DRIVER_ERRORS)
    classified = classify_postgres(error)
    assert isinstance(classified, StorageError)
    assert not isinstance(classified, StorageUnavailable)


def test_any_postgres_error_on_a_connection_found_closed_is_weather() -> None:
    error = asyncpg.InterfaceError("cannot perform operation: another operation is in progress")
    assert isinstance(classify_postgres(error, connection_closed=True), StorageUnavailable)


def test_the_message_names_the_step_and_the_driver_error() -> None:
    classified = classify_postgres(ConnectionRefusedError(111, "Connection refused"), doing="connecting")
    assert str(classified) == "PostgreSQL unavailable while connecting: ConnectionRefusedError: [Errno 111] Connection refused"


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.LockNotAvailableError("canceling statement due to lock timeout"),
        asyncpg.DeadlockDetectedError("deadlock detected"),
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_statement_that_gave_up_waiting_is_told_apart(error: BaseException) -> None:
    assert gave_up_waiting(error)
    assert isinstance(classify_postgres(error), StorageUnavailable)


@pytest.mark.parametrize(
    "error",
    [
        None,
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.IdleInTransactionSessionTimeoutError(
            "terminating connection due to idle-in-transaction timeout"
        ),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        TimeoutError(),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_database_out_of_reach_did_not_give_up_waiting(error: BaseException | None) -> None:
    assert not gave_up_waiting(error)


def test_bugs_and_cancellation_are_not_driver_errors() -> None:
    for error in (KeyError("x"), TypeError("x"), ValueError("x")):
        assert not isinstance(error, POSTGRES_DRIVER_ERRORS)
        assert not isinstance(error, SQLITE_DRIVER_ERRORS)


# -- SQLite: real errors from the sqlite3 module -------------------------------------------------


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "errors.db"
    with sqlite3.connect(path) as setup:
        setup.execute("CREATE TABLE jobs (priority INTEGER CHECK (priority >= 0))")
    yield path


def raised(path: Path, sql: str, *, isolation: str | None = None) -> sqlite3.Error:
    connection = sqlite3.connect(path, timeout=0, isolation_level=isolation)
    try:
        connection.execute(sql)
    except sqlite3.Error as error:
        return error
    finally:
        connection.close()
    raise AssertionError(f"{sql!r} did not fail")


def test_sqlite_database_is_locked_is_weather(database: Path) -> None:
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        error = raised(database, "BEGIN IMMEDIATE", isolation=None)
    finally:
        holder.close()
    assert "locked" in str(error)
    assert isinstance(classify_sqlite(error), StorageUnavailable)


def test_sqlite_a_closed_connection_is_weather(database: Path) -> None:
    connection = sqlite3.connect(database)
    connection.close()
    with pytest.raises(sqlite3.ProgrammingError) as closed:
        connection.execute("SELECT 1")
    assert isinstance(classify_sqlite(closed.value), StorageUnavailable)


def test_sqlite_a_file_that_cannot_be_opened_is_weather(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError) as cannot_open:
        sqlite3.connect(tmp_path / "missing-directory" / "x.db")
    assert isinstance(classify_sqlite(cannot_open.value), StorageUnavailable)


@pytest.mark.parametrize("sql", ["SELECT * FROM no_such_table", "INSERT INTO jobs VALUES (-1)", "SELEKT 1"])
def test_sqlite_errors_in_the_statement_or_its_data_are_permanent(database: Path, sql: str) -> None:
    classified = classify_sqlite(raised(database, sql))
    assert isinstance(classified, StorageError)
    assert not isinstance(classified, StorageUnavailable)


def test_sqlite_file_system_errors_are_weather() -> None:
    assert isinstance(classify_sqlite(PermissionError(13, "Permission denied")), StorageUnavailable)


# -- SQLite's bad days: the real errors, said with their cause and fix -------------------------------


def full_disk_error(path: Path) -> sqlite3.Error:
    """SQLite's own SQLITE_FULL ("database or disk is full"), by capping the file's page count."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute(f"PRAGMA max_page_count = {connection.execute('PRAGMA page_count').fetchone()[0]}")
        connection.execute("INSERT INTO jobs VALUES (zeroblob(1000000))")
    except sqlite3.Error as error:
        return error
    finally:
        connection.close()
    raise AssertionError("the insert did not fill the database")


def read_only_error(path: Path) -> sqlite3.Error:
    """SQLite's own SQLITE_READONLY, from a connection that opened the file read-only."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        connection.execute("INSERT INTO jobs VALUES (1)")
    except sqlite3.Error as error:
        return error
    finally:
        connection.close()
    raise AssertionError("a read-only connection wrote")


def test_sqlite_a_full_disk_is_weather_that_names_the_disk_and_the_fix(database: Path) -> None:
    error = full_disk_error(database)
    assert error.sqlite_errorcode == sqlite3.SQLITE_FULL
    classified = classify_sqlite(error, path=str(database))
    assert isinstance(classified, StorageUnavailable)
    assert str(classified).startswith(f"the disk holding {database} is full: free space on it; fastlane retries")
    assert "database or disk is full" in str(classified)  # the driver's words too


def test_sqlite_a_read_only_file_is_weather_that_names_the_file_and_the_fix(database: Path) -> None:
    error = read_only_error(database)
    assert error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_READONLY
    classified = classify_sqlite(error, path=str(database))
    assert isinstance(classified, StorageUnavailable)
    assert f"the database file {database} is read-only" in str(classified)
    assert "make it writable" in str(classified)
    # Without the path (a caller that does not know it), still weather, said generically.
    assert isinstance(classify_sqlite(error), StorageUnavailable)


@pytest.mark.parametrize(("code", "words"), [
    (sqlite3.SQLITE_IOERR_WRITE, "an I/O error on the disk holding"),
    (sqlite3.SQLITE_IOERR_FSYNC, "an I/O error on the disk holding"),
    (sqlite3.SQLITE_READONLY_DBMOVED, "is read-only"),
    (sqlite3.SQLITE_READONLY_RECOVERY, "is read-only"),
    (sqlite3.SQLITE_CANTOPEN, "cannot open the database file"),
])
def test_sqlite_extended_codes_of_a_write_fault_are_named(code: int, words: str) -> None:
    error = sqlite3.OperationalError("the driver's words")
    error.sqlite_errorcode = code
    classified = classify_sqlite(error, path="/var/lib/fastlane.db")
    assert isinstance(classified, StorageUnavailable)
    assert words in str(classified) and "/var/lib/fastlane.db" in str(classified)


@pytest.mark.parametrize(("error", "words"), [
    (OSError(28, "No space left on device"), "is full"),
    (OSError(30, "Read-only file system"), "is read-only"),
    (OSError(5, "Input/output error"), "I/O error"),
])
def test_sqlite_file_system_errors_of_a_write_fault_are_named(error: OSError, words: str) -> None:
    fault = sqlite_write_fault(error, path="/var/lib/fastlane.db")
    assert fault is not None and words in fault


def test_a_lock_or_a_bad_statement_is_no_write_fault(database: Path) -> None:
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        locked = raised(database, "BEGIN IMMEDIATE", isolation=None)
    finally:
        holder.close()
    assert sqlite_write_fault(locked, path=str(database)) is None
    assert sqlite_write_fault(raised(database, "SELEKT 1"), path=str(database)) is None
