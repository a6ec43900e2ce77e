"""The errors a node raises inside itself: what it refuses (not found, conflicts, states, access,
quotas), what its database did (unreachable, a stale fence), and the error id of a record.

None of them reaches a user as such: the API turns each into a gRPC status
(:mod:`fastlane.rpc.status`), which a client raises as the matching
:class:`~fastlane.errors.RemoteError`. The public tree is :mod:`fastlane.errors`.
"""

from __future__ import annotations

import secrets

from fastlane.errors import FastlaneError


def new_error_id() -> str:
    """A short id that ties what a caller or a stored record is told to a traceback in the log."""
    return secrets.token_hex(6)


# -- storage -----------------------------------------------------------------------------------


class StorageError(FastlaneError):
    """A store operation failed. The driver's exception is kept as ``__cause__``."""


class StorageUnavailable(StorageError):
    """The database cannot be reached right now; the operation may succeed if retried."""


class NotFound(StorageError):
    """The object asked for does not exist (for this tenant)."""

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        super().__init__(f"{kind} {key!r} not found")


class JobNotFound(NotFound):
    def __init__(self, job_id: str) -> None:
        super().__init__("job", job_id)


class RunNotFound(NotFound):
    def __init__(self, run_id: str) -> None:
        super().__init__("run", run_id)


class TokenNotFound(NotFound):
    def __init__(self, token_id: str) -> None:
        super().__init__("token", token_id)


class Conflict(StorageError):
    """The change contradicts the current state (a name already taken with another spec, say)."""


class JobAlreadyExists(Conflict):
    def __init__(self, tenant: str, name: str, differing_field: str) -> None:
        self.tenant = tenant
        self.name = name
        super().__init__(
            f"a job named {name!r} already exists in tenant {tenant!r} with a different "
            f"{differing_field}; choose another name or update the existing job (fastlane jobs update)"
        )


class InvalidState(Conflict):
    """The object is in a state where the requested change makes no sense."""

    def __init__(self, kind: str, key: str, state: str, wanted: str) -> None:
        super().__init__(f"{kind} {key!r} is {state}; cannot {wanted}")


# -- access ------------------------------------------------------------------------------------


class Unauthenticated(FastlaneError):
    """The caller did not prove who it is: no token, or one unknown, expired or revoked."""


class PermissionDenied(FastlaneError):
    """The caller is known but may not do this (its role, or another tenant)."""


class QuotaExceeded(FastlaneError):
    """A tenant's quota would be exceeded; the message names the quota and its limit."""


# -- fencing -----------------------------------------------------------------------------------


class StaleFence(FastlaneError):
    """A write on behalf of a shard was refused: this node no longer holds the shard's lease.

    The node must drop everything it holds for that shard and fire nothing more for it.
    """

    def __init__(self, shard_id: int, owner: str, token: int) -> None:
        self.shard_id = shard_id
        self.owner = owner
        self.token = token
        super().__init__(
            f"shard {shard_id}: lease of {owner!r} with token {token} is no longer valid "
            "(taken over, released or expired by the database clock)"
        )
