"""Why a worker's stream to a node ended, and when the worker warns that the node is out of reach:
at growing intervals through one outage."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

_ACCESS_REFUSALS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
# How gRPC's transport words a failed TLS handshake (its details are the only place it says so).
_TLS_FAILURE_SIGNS = ("handshake failed", "certificate_verify_failed", "ssl_error")
# How long into an outage a warning is logged: then each this many seconds apart, once past the list.
_OUTAGE_WARNINGS = (10.0, 30.0, 60.0, 120.0, 300.0)


class Outage:
    """When a stream's node has been out of reach long enough to warn again (``now``: a monotonic
    clock, for tests): at each of :data:`_OUTAGE_WARNINGS` seconds, then every last one of them."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._since: float | None = None
        self._warned = 0  # warnings given in this outage

    def warning_due(self) -> float | None:
        """Note a failed attempt; the outage's length when a warning is due now, else None."""
        now = self._now()
        if self._since is None:
            self._since = now
        lasted = now - self._since
        steps = _OUTAGE_WARNINGS
        due_at = steps[self._warned] if self._warned < len(steps) else steps[-1] * (self._warned - len(steps) + 2)
        if lasted < due_at:
            return None
        self._warned += 1
        return lasted

    def ended(self) -> float | None:
        """The stream is up again: how long the outage lasted, if it was warned of (else None)."""
        since, warned, self._since, self._warned = self._since, self._warned, None, 0
        return None if since is None or not warned else self._now() - since


def unreachable(address: str, lasted: float, attempts: int, last: str | None) -> str:
    """The warning of a node out of reach, with what to check."""
    return (f"cannot reach {address} for {lasted:.0f} s ({attempts} attempts; last: {last}): check that a node "
            f"listens there (`fastlane cluster --server {address}`), the address (--server, $FASTLANE_SERVER) and "
            "that the TLS flags match the node's; its runs wait until then")


@dataclass(frozen=True)
class StreamEnd:
    """How a stream ended (``error``: None when the node closed it): the words for the reconnect
    lines, and whether the node refused the worker's token or the TLS handshake failed."""

    text: str
    refused: bool = False
    tls_failed: bool = False

    @classmethod
    def of(cls, error: BaseException | None) -> StreamEnd:
        if error is None:
            return cls("the node ended the stream")
        if not isinstance(error, grpc.aio.AioRpcError):
            return cls(f"{type(error).__name__}: {error}")
        code = error.code()
        tls_failed = (code is grpc.StatusCode.UNAVAILABLE
                      and any(sign in (error.details() or "").lower() for sign in _TLS_FAILURE_SIGNS))
        return cls(f"{code.name}: {error.details()}", refused=code in _ACCESS_REFUSALS, tls_failed=tls_failed)
