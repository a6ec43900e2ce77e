"""Connecting to one of several PostgreSQL servers (a primary and its standbys), each host within a
share of the time of its own.

asyncpg tries the hosts of a multi-host URL (``postgresql://u@h1:5432,h2:5432/db``) in order, but
under one timeout for them all: a first host that answers nothing (a dead machine, a partition:
no refusal, no reset) uses the whole of it, and the writable server after it is never tried. That
is the very failover a standby is for. So here each host gets an equal share of the timeout, as
libpq's ``connect_timeout`` is per host, and connections begin with the host that last gave one:
after a failover, the promoted standby is tried first from then on, and a dead old primary costs
nothing more.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import asyncpg

from fastlane.storage.driver_errors import POSTGRES_DRIVER_ERRORS


def host_urls(url: str) -> list[str]:
    """``url`` once per host it names, in order, each naming that host alone (a URL of one host
    comes back as it is)."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [url]
    return [urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}")) for host in hosts.split(",") if host]


class HostRotation:
    """``connect`` for asyncpg (the pool's ``connect=``, or called directly): the hosts of ``url``
    one at a time, beginning with the last that gave a usable connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._urls = host_urls(url)
        self._first = 0

    async def connect(self, dsn: str | None = None, *, timeout: float, **options: Any) -> Any:
        """A connection to the first host that gives one the URL's ``target_session_attrs``
        accept, each host within ``timeout`` / number of hosts. ``dsn`` is ignored (the pool
        passes its own URL back). Raises the last host's error when none does."""
        if len(self._urls) == 1:
            return await asyncpg.connect(self._urls[0], timeout=timeout, **options)
        share = timeout / len(self._urls)
        failure: BaseException | None = None
        for step in range(len(self._urls)):
            index = (self._first + step) % len(self._urls)
            try:
                connection = await asyncpg.connect(self._urls[index], timeout=share, **options)
            except POSTGRES_DRIVER_ERRORS as error:
                failure = error
                continue
            self._first = index
            return connection
        assert failure is not None
        raise failure
