"""The one table mapping fastlane errors to gRPC status codes, and back for clients."""

from __future__ import annotations

import grpc

from fastlane.domain.errors import (
    Conflict,
    InvalidState,
    JobAlreadyExists,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    StaleFence,
    StorageUnavailable,
    Unauthenticated,
)
from fastlane.errors import (
    ConfigurationError,
    FastlaneError,
    InvalidArgument,
    RemoteAlreadyExists,
    RemoteError,
    RemoteInvalidArgument,
    RemoteNotFound,
    RemotePermissionDenied,
    RemoteUnauthenticated,
    RemoteUnavailable,
)

# Most specific first: the first matching class decides.
_TO_STATUS: tuple[tuple[type[FastlaneError], grpc.StatusCode], ...] = (
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (JobAlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (InvalidState, grpc.StatusCode.FAILED_PRECONDITION),
    (Conflict, grpc.StatusCode.ABORTED),
    (StorageUnavailable, grpc.StatusCode.UNAVAILABLE),
    (StaleFence, grpc.StatusCode.UNAVAILABLE),
    (ConfigurationError, grpc.StatusCode.FAILED_PRECONDITION),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (QuotaExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
)


def status_of(error: FastlaneError) -> grpc.StatusCode:
    for kind, code in _TO_STATUS:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


_FROM_STATUS: dict[grpc.StatusCode, type[RemoteError]] = {
    grpc.StatusCode.NOT_FOUND: RemoteNotFound,
    grpc.StatusCode.INVALID_ARGUMENT: RemoteInvalidArgument,
    grpc.StatusCode.ALREADY_EXISTS: RemoteAlreadyExists,
    grpc.StatusCode.UNAVAILABLE: RemoteUnavailable,
    grpc.StatusCode.UNAUTHENTICATED: RemoteUnauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: RemotePermissionDenied,
}


def error_from_rpc(error: grpc.RpcError) -> RemoteError:
    """The client-side exception for a failed call (keeps the daemon's message verbatim)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return _FROM_STATUS.get(code, RemoteError)(code, details or code.name)
