"""A multi-host PostgreSQL URL taken apart into one URL per host (see fastlane.storage.postgres.hosts;
the connecting itself is tested against real servers in tests/contract/test_postgres_failover.py)."""

from __future__ import annotations

import pytest

from fastlane.storage.postgres.hosts import host_urls


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql://fastlane@db:5432/fastlane", ["postgresql://fastlane@db:5432/fastlane"]),
    (
        "postgresql://fastlane:pw@pg-0:5432,pg-1:6432/fastlane?target_session_attrs=read-write&sslmode=require",
        [
            "postgresql://fastlane:pw@pg-0:5432/fastlane?target_session_attrs=read-write&sslmode=require",
            "postgresql://fastlane:pw@pg-1:6432/fastlane?target_session_attrs=read-write&sslmode=require",
        ],
    ),
    ("postgres://pg-0,pg-1,[::1]:5433/db", ["postgres://pg-0/db", "postgres://pg-1/db", "postgres://[::1]:5433/db"]),
    ("postgresql://u@pg-0,/db", ["postgresql://u@pg-0/db"]),  # an empty host is no host
])
def test_each_host_of_a_url_gets_a_url_of_its_own(url, expected):
    assert host_urls(url) == expected
