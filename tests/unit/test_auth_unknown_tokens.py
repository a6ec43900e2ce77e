"""Unknown token ids cost the database one read at most, and a source only so many: probing ids is
answered from memory, whatever the id (issue S3: timing told live token ids from dead ones).

A fake token store counts the reads; the clocks are fakes too, so nothing here measures time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from fastlane.auth import secrets
from fastlane.auth.authenticator import (
    UNKNOWN_CACHE_SECONDS,
    UNKNOWN_LOOKUP_BURST,
    UNKNOWN_LOOKUPS_PER_SECOND,
    Authenticator,
)
from fastlane.domain.access import ApiToken, Role
from fastlane.domain.errors import StorageUnavailable, Unauthenticated
from fastlane.server.access import source_of

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class CountingTokens:
    """The token half of a store: the rows it has, and every id it was asked for."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[ApiToken, bytes]] = {}
        self.asked: list[str] = []
        self.down = False

    async def find_token(self, token_id: str) -> tuple[ApiToken, bytes] | None:
        self.asked.append(token_id)
        if self.down:
            raise StorageUnavailable("database away")
        return self.rows.get(token_id)

    async def touch_tokens(self, used: dict[str, datetime]) -> None:
        return None

    def add(self, name: str = "") -> str:
        secret = secrets.new_secret()
        token = ApiToken(token_id=secret.token_id, tenant="a", role=Role.CLIENT, name=name, created_at=NOW)
        self.rows[secret.token_id] = (token, secrets.hash_secret(secret))
        return f"Bearer {secret}"


class FakeStore:
    def __init__(self) -> None:
        self.tokens = CountingTokens()


class Clock:
    def __init__(self) -> None:
        self.seconds = 1000.0

    def __call__(self) -> float:
        return self.seconds


def never_seen() -> str:
    return f"Bearer {secrets.new_secret()}"


@pytest.fixture
def parts() -> tuple[Authenticator, CountingTokens, Clock]:
    store, clock = FakeStore(), Clock()
    store_any: Any = store
    return Authenticator(store_any, now=lambda: NOW, monotonic=clock), store.tokens, clock


async def refused(authenticator: Authenticator, authorization: str, source: str | None) -> str:
    with pytest.raises(Unauthenticated) as error:
        await authenticator.authenticate(authorization, source=source)
    return str(error.value)


async def test_a_stream_of_never_seen_ids_reaches_the_store_at_most_the_bucket_worth(parts):
    authenticator, tokens, _ = parts
    for _ in range(500):
        await refused(authenticator, never_seen(), "ipv4:203.0.113.9")
    assert len(tokens.asked) == UNKNOWN_LOOKUP_BURST


async def test_the_bucket_refills_at_its_rate_and_each_source_has_its_own(parts):
    authenticator, tokens, clock = parts
    for _ in range(UNKNOWN_LOOKUP_BURST + 5):
        await refused(authenticator, never_seen(), "ipv4:203.0.113.9")
    clock.seconds += 10 / UNKNOWN_LOOKUPS_PER_SECOND
    for _ in range(50):
        await refused(authenticator, never_seen(), "ipv4:203.0.113.9")
    assert len(tokens.asked) == UNKNOWN_LOOKUP_BURST + 10
    await refused(authenticator, never_seen(), "ipv4:198.51.100.1")
    assert len(tokens.asked) == UNKNOWN_LOOKUP_BURST + 11


async def test_an_unknown_id_is_read_once_within_the_ttl_then_again(parts):
    authenticator, tokens, clock = parts
    probe = never_seen()
    for _ in range(100):
        await refused(authenticator, probe, "ipv4:203.0.113.9")
    assert len(tokens.asked) == 1
    clock.seconds += UNKNOWN_CACHE_SECONDS + 1
    await refused(authenticator, probe, "ipv4:203.0.113.9")
    assert len(tokens.asked) == 2


async def test_tokens_that_exist_spend_no_budget_and_work_after_a_flood_from_elsewhere(parts):
    authenticator, tokens, _ = parts
    live = [tokens.add(f"app-{index}") for index in range(3 * UNKNOWN_LOOKUP_BURST)]
    for authorization in live:  # many tokens from one address (workers behind one NAT)
        assert (await authenticator.authenticate(authorization, source="ipv4:10.0.0.7")).tenant == "a"
    for _ in range(100):
        await refused(authenticator, never_seen(), "ipv4:203.0.113.9")
    late = tokens.add("made-after-the-flood")
    assert (await authenticator.authenticate(late, source="ipv4:10.0.0.7")).name == "made-after-the-flood"


async def test_a_spent_source_is_refused_without_a_read_even_for_a_live_token(parts):
    authenticator, tokens, _ = parts
    for _ in range(UNKNOWN_LOOKUP_BURST):
        await refused(authenticator, never_seen(), "ipv4:203.0.113.9")
    reads = len(tokens.asked)
    message = await refused(authenticator, tokens.add(), "ipv4:203.0.113.9")
    assert "too many unknown tokens" in message and len(tokens.asked) == reads


async def test_a_lookup_that_cannot_be_made_spends_nothing_and_stays_unavailable(parts):
    authenticator, tokens, _ = parts
    tokens.down = True
    for _ in range(3 * UNKNOWN_LOOKUP_BURST):
        with pytest.raises(StorageUnavailable):
            await authenticator.authenticate(never_seen(), source="ipv4:10.0.0.7")
    tokens.down = False
    await refused(authenticator, never_seen(), "ipv4:10.0.0.7")  # its budget is whole


async def test_a_deleted_token_is_remembered_as_unknown(parts):
    authenticator, tokens, clock = parts
    authorization = tokens.add()
    caller = await authenticator.authenticate(authorization, source="ipv4:10.0.0.7")
    del tokens.rows[caller.token_id or ""]
    clock.seconds += 5
    assert await authenticator.still_valid(caller) == f"token {caller.token_id} is not known"
    reads = len(tokens.asked)
    await refused(authenticator, authorization, "ipv4:10.0.0.7")
    assert len(tokens.asked) == reads


@pytest.mark.parametrize(("peer", "source"), [
    ("ipv4:10.0.0.7:51234", "ipv4:10.0.0.7"),
    ("ipv6:[::1]:7070", "ipv6:[::1]"),
    ("ipv6:%5B2001:db8::1%5D:443", "ipv6:%5B2001:db8::1%5D"),
    ("unix:/run/fastlane.sock", "unix:/run/fastlane.sock"),
    (None, ""),
])
def test_the_source_of_a_call_is_its_host_without_the_port(peer, source):
    assert source_of(peer) == source
