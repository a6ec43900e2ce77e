"""The errors a user of fastlane may catch; every one derives from :class:`FastlaneError`::

    FastlaneError
    ├── InvalidArgument             a value given here is not acceptable (field and problem)
    │   └── ScheduleError           a cron expression, instant or interval cannot be understood
    │       └── UnknownTimeZone     not an IANA time zone name
    ├── ConfigurationError          a client, worker or daemon set up in a way that cannot work
    ├── RemoteError                 a daemon refused a call; ``code`` is its gRPC status
    │   ├── RemoteInvalidArgument   the request was not valid (the message names the field)
    │   ├── RemoteNotFound          no such job, run, workflow or token in the tenant
    │   ├── RemoteAlreadyExists     a job of that name exists with another spec
    │   ├── RemoteUnavailable       the daemon (or its database) cannot be reached now; retry
    │   ├── RemoteUnauthenticated   no API token, or one unknown, expired or revoked
    │   └── RemotePermissionDenied  the token's role or tenant does not allow the call
    ├── RetryableError              raised by a handler: this attempt failed, a later one may not
    └── PermanentError              raised by a handler: the run can never succeed; no retry

Constructors take the identifiers involved and build a message that says what was wrong and
what would be right, so ``str(error)`` can be shown to a person unchanged. The errors a node
raises inside itself live in :mod:`fastlane.domain.errors`.
"""

from __future__ import annotations

import grpc


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
    """The daemon, a worker or a client was configured in a way that cannot work."""


# -- refused by a daemon ---------------------------------------------------------------------


class RemoteError(FastlaneError):
    """An error a daemon reported, with its gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.details = message  # the daemon's own words, without the status name
        super().__init__(f"{code.name}: {message}")


class RemoteNotFound(RemoteError):
    pass


class RemoteInvalidArgument(RemoteError):
    pass


class RemoteAlreadyExists(RemoteError):
    pass


class RemoteUnavailable(RemoteError):
    pass


class RemoteUnauthenticated(RemoteError):
    """The node requires an API token and got none, or refused the one it got (unknown, revoked,
    expired): retrying with the same token will not help."""


class RemotePermissionDenied(RemoteError):
    """The token is valid, but its role or tenant does not allow this call."""


# -- raised by handlers ----------------------------------------------------------------------


class RetryableError(FastlaneError):
    """Raised by a handler: the attempt failed, and a later attempt may succeed."""


class PermanentError(FastlaneError):
    """Raised by a handler: the run can never succeed; do not retry it."""
