"""The PostgreSQL store's API tokens: the records and secret hashes the authentication layer
checks calls against (:mod:`fastlane.auth`), never a secret itself.

Nothing here is notified: a node reads a token when a call presents it, so a revocation reaches
the other nodes as soon as they read it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from fastlane.clock import ensure_utc
from fastlane.domain.access import ApiToken
from fastlane.domain.validation import validate_token
from fastlane.errors import Conflict, TokenNotFound
from fastlane.storage import codec
from fastlane.storage.postgres import queries
from fastlane.storage.postgres.connection import PostgresConnections


class PostgresTokens(PostgresConnections):
    """API token methods of :class:`~fastlane.storage.postgres.PostgresStore`."""

    async def create_token(self, token: ApiToken, secret_hash: bytes) -> ApiToken:
        validate_token(token)
        async with self._transaction() as db:
            row = await db.fetchrow(
                queries.INSERT_TOKEN,
                token.token_id, token.tenant, token.role.value, token.name, secret_hash, token.expires_at,
            )
        if row is None:
            raise Conflict(f"token {token.token_id!r} already exists; make the new token with another id")
        return codec.build_token(row)

    async def find_token(self, token_id: str) -> tuple[ApiToken, bytes] | None:
        async with self._connection() as db:
            row = await db.fetchrow(queries.GET_TOKEN, token_id)
        return None if row is None else (codec.build_token(row), bytes(row["secret_hash"]))

    async def list_tokens(self, tenant: str | None = None) -> list[ApiToken]:
        async with self._connection() as db:
            rows = await db.fetch(queries.LIST_TOKENS, tenant)
        return [codec.build_token(row) for row in rows]

    async def revoke_token(self, token_id: str, *, tenant: str | None = None) -> ApiToken:
        async with self._transaction() as db:
            row = await db.fetchrow(queries.REVOKE_TOKEN, token_id, tenant)
        if row is None:
            raise TokenNotFound(token_id)
        return codec.build_token(row)

    async def touch_tokens(self, used: Mapping[str, datetime]) -> None:
        if not used:
            return
        # In id order, so that two nodes touching the same tokens lock their rows in the same
        # order and cannot deadlock each other.
        token_ids = sorted(used)
        # ensure_utc refuses a naive time, as the SQLite store does, instead of asyncpg reading it as UTC.
        used_at = [ensure_utc(used[token_id]) for token_id in token_ids]
        async with self._transaction() as db:
            await db.execute(queries.TOUCH_TOKENS, token_ids, used_at)
