"""The fastlane error tree.

Every error raised on purpose derives from :class:`FastlaneError`. Constructors take the
identifiers involved and build a message that says what was wrong and what would be right, so the
API layer can pass ``str(error)`` to a person unchanged.
"""

from __future__ import annotations

import secrets


def new_error_id() -> str:
    """A short id that ties what a caller or a stored record is told to a traceback in the log."""
    return secrets.token_hex(6)


class FastlaneError(Exception):
    """Root of every error fastlane raises on purpose."""


# -- input -------------------------------------------------------------------------------------


class InvalidArgument(FastlaneError):
    """A value given by a caller is not acceptable."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class ScheduleError(InvalidArgument):
    """A schedule cannot be understood (bad cron expression, bad instant, bad interval)."""


class UnknownTimeZone(ScheduleError):
    """The time zone is not an IANA zone name."""

    def __init__(self, name: str) -> None:
        hint = "use an IANA name such as 'America/New_York' or 'Europe/Paris'"
        if name.isalpha() and name.isupper() and len(name) <= 5:
            hint = f"abbreviations like {name!r} are ambiguous; {hint}"
        super().__init__("timezone", f"unknown time zone {name!r}: {hint}")


class ConfigurationError(FastlaneError):
    """The daemon or a client was configured in a way that cannot work."""


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


# -- workers -----------------------------------------------------------------------------------


class WorkerProtocolError(FastlaneError):
    """A worker stream broke the protocol (no hello first, credits below zero, ...)."""


class RetryableError(FastlaneError):
    """Raised by a handler: the attempt failed, and a later attempt may succeed."""


class PermanentError(FastlaneError):
    """Raised by a handler: the run can never succeed; do not retry it."""
