"""The SQLite store's API tokens: the records and secret hashes the authentication layer checks
calls against (:mod:`fastlane.auth`), never a secret itself."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from fastlane.domain.access import ApiToken
from fastlane.domain.validation import validate_token
from fastlane.errors import Conflict, TokenNotFound
from fastlane.storage import codec
from fastlane.storage.sqlite import queries
from fastlane.storage.sqlite.connection import SQLiteConnections, fetch_all, fetch_one, instant, json_array


class SQLiteTokens(SQLiteConnections):
    """API token methods of :class:`~fastlane.storage.sqlite.SQLiteStore`."""

    async def create_token(self, token: ApiToken, secret_hash: bytes) -> ApiToken:
        validate_token(token)
        async with self._transaction() as db:
            row = await fetch_one(
                db,
                queries.INSERT_TOKEN,
                (token.token_id, token.tenant, token.role.value, token.name, secret_hash,
                 instant(token.expires_at)),
            )
        if row is None:
            raise Conflict(f"token {token.token_id!r} already exists; make the new token with another id")
        return codec.build_token(row)

    async def find_token(self, token_id: str) -> tuple[ApiToken, bytes] | None:
        async with self._read() as db:
            row = await fetch_one(db, queries.GET_TOKEN, (token_id,))
        return None if row is None else (codec.build_token(row), bytes(row["secret_hash"]))

    async def list_tokens(self, tenant: str | None = None) -> list[ApiToken]:
        async with self._read() as db:
            rows = await fetch_all(db, queries.LIST_TOKENS, (tenant, tenant))
        return [codec.build_token(row) for row in rows]

    async def revoke_token(self, token_id: str, *, tenant: str | None = None) -> ApiToken:
        async with self._transaction() as db:
            row = await fetch_one(db, queries.REVOKE_TOKEN, (token_id, tenant, tenant))
        if row is None:
            raise TokenNotFound(token_id)
        return codec.build_token(row)

    async def touch_tokens(self, used: Mapping[str, datetime]) -> None:
        if not used:
            return
        batch = json_array([token_id, instant(used_at)] for token_id, used_at in used.items())
        async with self._transaction() as db:
            await db.execute(queries.TOUCH_TOKENS, (batch,))
