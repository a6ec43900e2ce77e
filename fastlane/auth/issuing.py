"""Making a new API token: the one place a secret exists in the clear, before it is handed out."""

from __future__ import annotations

from datetime import timedelta

from fastlane.auth import secrets
from fastlane.domain import validation
from fastlane.domain.access import ApiToken, Role
from fastlane.domain.limits import MAX_TOKEN_LIFETIME
from fastlane.errors import InvalidArgument
from fastlane.storage import Store


async def issue_token(
    store: Store, *, tenant: str, role: Role, name: str = "", expires_in: timedelta | None = None
) -> tuple[ApiToken, secrets.TokenSecret]:
    """Create a token and store its hash; the secret is returned, to be shown once.

    Raises:
        InvalidArgument: a bad tenant or name, or a lifetime not within (0, 10 years].
    """
    validation.name("tenant", tenant)
    if expires_in is not None and not timedelta(0) < expires_in <= MAX_TOKEN_LIFETIME:
        raise InvalidArgument("expires_in", f"{expires_in} must be positive and at most {MAX_TOKEN_LIFETIME.days} days")
    secret = secrets.new_secret()
    now = await store.db_now()
    record = ApiToken(token_id=secret.token_id, tenant=tenant, role=role, name=name, created_at=now,
                      expires_at=now + expires_in if expires_in is not None else None)
    stored = await store.tokens.create_token(record, secrets.hash_secret(secret))
    return stored, secret
