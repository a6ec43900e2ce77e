"""The throwaway PostgreSQL cluster the benchmarks run against: it lives in the test kit
(:mod:`fastlane.testing.postgres`), shared with the test suite; these are its names."""

from __future__ import annotations

from fastlane.testing.postgres import (  # noqa: F401
    DURABLE_SETTINGS,
    ENV_DSN,
    FAST_SETTINGS,
    REPLICATION_SETTINGS,
    SERVER_USER,
    PostgresClusterError,
    StandbyPostgres,
    ThrowawayPostgres,
    adopt_orphans,
    create_database,
    drop_database,
    dsn_for_database,
    dsn_from_env,
    multi_host_dsn,
    reap,
    replicated_pair,
)
