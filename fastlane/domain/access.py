"""Who may call: API tokens, the tenant each belongs to, and its role.

A token belongs to one tenant and carries one role; the role decides which calls it may make
(:mod:`fastlane.auth.roles`), the tenant decides what those calls see. Only a hash of the secret
is stored (:mod:`fastlane.auth.secrets`); this record is everything else about the token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Role(StrEnum):
    """What a token may do, within its tenant (an admin: in every tenant)."""

    ADMIN = "admin"  # everything, in any tenant; tokens; the cluster
    CLIENT = "client"  # create, change, trigger and read the jobs and runs of its tenant
    WORKER = "worker"  # connect a worker stream and run its tenant's runs; nothing else
    VIEWER = "viewer"  # read the jobs and runs of its tenant; change nothing


@dataclass(frozen=True, slots=True)
class ApiToken:
    """A token as stored and listed (never with its secret).

    Attributes:
        token_id: Public id, also the first part of the secret string; safe to log and show.
        expires_at: None: never expires.
        revoked_at: None: not revoked.
        last_used_at: When a node last accepted it (updated at most every few seconds).
    """

    token_id: str
    tenant: str
    role: Role
    name: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None

    def refusal(self, now: datetime) -> str | None:
        """Why the token cannot be used at ``now``, or None if it can."""
        if self.revoked_at is not None:
            return f"token {self.token_id} was revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return f"token {self.token_id} expired at {self.expires_at.isoformat()}"
        return None
