"""fastlane's test kit: test a worker's handlers without a daemon, and wait, time and databases
for tests.

- :class:`FakeNode`: a stand-in daemon on 127.0.0.1 that a real :class:`~fastlane.Worker`
  connects to; the test assigns runs (:meth:`FakeNode.run`, :meth:`FakeNode.assign`) and reads
  back each :class:`RunResult`, its checkpoints, or cancels it through its :class:`RunHandle`.
- :func:`until`: wait for a condition on short polls, bounded, instead of sleeping.
- :class:`ManualClock`: a ``Clock`` that moves only when told.
- :class:`ThrowawayPostgres`: a private PostgreSQL cluster in a temporary directory (needs the
  server binaries), with :func:`create_database` and :func:`drop_database`.

fastlane's own suite uses the same kit. Lower-level pieces live in submodules: the wire-level
fake stream the SDK's tests script message by message (:mod:`fastlane.testing.wire`), and real
daemon and worker processes (:mod:`fastlane.testing.processes`). See ``docs/testing.md``.
"""

from fastlane.testing.clock import ManualClock
from fastlane.testing.node import FakeNode, RunHandle, RunResult
from fastlane.testing.postgres import (
    DURABLE_SETTINGS,
    FAST_SETTINGS,
    PostgresClusterError,
    ThrowawayPostgres,
    create_database,
    drop_database,
    dsn_from_env,
)
from fastlane.testing.processes import free_port
from fastlane.testing.waiting import WaitTimedOut, until

__all__ = [
    "DURABLE_SETTINGS",
    "FAST_SETTINGS",
    "FakeNode",
    "ManualClock",
    "PostgresClusterError",
    "RunHandle",
    "RunResult",
    "ThrowawayPostgres",
    "WaitTimedOut",
    "create_database",
    "drop_database",
    "dsn_from_env",
    "free_port",
    "until",
]
