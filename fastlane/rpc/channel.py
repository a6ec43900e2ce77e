"""Channels to a fastlane node: plain or TLS, with the caller's bearer token on every call.

The client library, the CLI and the worker SDK all dial through :func:`open_channel`, and find
their token with :func:`load_token`.

Why interceptors and not ``grpc.access_token_call_credentials``: gRPC sends call credentials only
over a secure channel and refuses them on an insecure one, while a token must also work against a
node on loopback without TLS, for development. Interceptors add plain metadata on any channel. The
price is that without TLS the token crosses the network in clear, so :func:`open_channel` warns
when that happens to a host that is not loopback.

``grpc.aio`` files each interceptor under the first of the four call kinds it is an instance of,
so one class deriving from all four would only ever see unary-unary calls: there is one small
class per kind, sharing :class:`_BearerToken`.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc

from fastlane.auth.tls import ClientTls, channel_credentials
from fastlane.errors import ConfigurationError

log = logging.getLogger("fastlane.rpc")

DEFAULT_PORT: Final = 7070
DEFAULT_SERVER: Final = f"127.0.0.1:{DEFAULT_PORT}"  # where a client looks for a node by default
TOKEN_ENV: Final = "FASTLANE_TOKEN"
TOKEN_FILE_FLAG: Final = "--token-file"
AUTHORIZATION: Final = "authorization"

Request = TypeVar("Request")
Response = TypeVar("Response")


def open_channel(
    target: str,
    *,
    tls: ClientTls | None = None,
    token: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """Open a channel to a node; like ``grpc.aio.insecure_channel`` / ``secure_channel``.

    Args:
        target: ``HOST:PORT`` of a node (or any gRPC target string).
        tls: Connect with TLS, checking the node's certificate as this says (and presenting a
            client certificate if it names one); None connects without TLS. The files are read
            now: a channel keeps the credentials it was opened with.
        token: Sent as ``authorization: Bearer <token>`` with every call, unary and streaming
            alike. A call that already carries ``authorization`` metadata keeps its own; any
            other metadata the caller passes is sent as well.
        options: gRPC channel options, passed on unchanged. To check the node's certificate
            against another name than the target's host, pass
            ``("grpc.ssl_target_name_override", NAME)``.

    Raises:
        ConfigurationError: A TLS file cannot be read or used, or the token is empty or holds
            characters that cannot be sent as metadata.
    """
    interceptors = None if token is None else _bearer_interceptors(token)
    if tls is None:
        if token is not None and not _is_loopback(target):
            log.warning(
                "sending the API token to %s without TLS: anyone on the path can read it; "
                "connect with TLS to any node that is not on this machine", target,
            )
        return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(target, channel_credentials(tls), options=list(options), interceptors=interceptors)


def load_token(token_file: Path | None = None, *, environ: Mapping[str, str] = os.environ) -> str | None:
    """The API token to call with: from ``--token-file``, else ``FASTLANE_TOKEN``, else None.

    Surrounding whitespace (the newline an editor or ``echo`` leaves) is dropped; an empty or
    blank ``FASTLANE_TOKEN`` counts as unset.

    Raises:
        ConfigurationError: ``token_file`` was given but cannot be read, or is empty.
    """
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            raise ConfigurationError(f"{TOKEN_FILE_FLAG} {token_file}: cannot read the token: {reason}") from error
        if not token:
            raise ConfigurationError(f"{TOKEN_FILE_FLAG} {token_file}: the file is empty; it should hold the API token")
        return token
    return environ.get(TOKEN_ENV, "").strip() or None


# -- the bearer token on every call ------------------------------------------------------------


class _BearerToken:
    """Adds ``authorization: Bearer <token>`` to the details of a call."""

    def __init__(self, token: str) -> None:
        # Metadata values must be printable ASCII; gRPC would otherwise fail each call with a
        # message that does not say why. The token itself is never put into a message.
        if not token or not all("!" <= character <= "~" for character in token):
            raise ConfigurationError(
                "the API token must be non-empty printable ASCII without spaces, as `fastlane` issued it; "
                "check the token file or FASTLANE_TOKEN"
            )
        self._value = f"Bearer {token}"

    def add_to(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        # A new Metadata: the caller's own object arrives here as it is and may be reused for
        # other calls, so it must not be changed.
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        if AUTHORIZATION not in metadata.keys():
            metadata.add(AUTHORIZATION, self._value)
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=details.timeout,
            metadata=metadata,
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )


def _bearer_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    bearer = _BearerToken(token)
    return [
        _UnaryUnaryBearer(bearer),
        _UnaryStreamBearer(bearer),
        _StreamUnaryBearer(bearer),
        _StreamStreamBearer(bearer),
    ]


class _UnaryUnaryBearer(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, bearer: _BearerToken) -> None:
        self._bearer = bearer

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Request], Awaitable[grpc.aio.UnaryUnaryCall[Request, Response]]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Request,
    ) -> grpc.aio.UnaryUnaryCall[Request, Response]:
        return await continuation(self._bearer.add_to(client_call_details), request)


class _UnaryStreamBearer(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, bearer: _BearerToken) -> None:
        self._bearer = bearer

    async def intercept_unary_stream(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Request], Awaitable[grpc.aio.UnaryStreamCall[Request, Response]]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Request,
    ) -> grpc.aio.UnaryStreamCall[Request, Response]:
        return await continuation(self._bearer.add_to(client_call_details), request)


class _StreamUnaryBearer(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, bearer: _BearerToken) -> None:
        self._bearer = bearer

    async def intercept_stream_unary(
        self,
        continuation: Callable[
            [grpc.aio.ClientCallDetails, AsyncIterable[Request] | Iterable[Request]],
            Awaitable[grpc.aio.StreamUnaryCall[Request, Response]],
        ],
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: AsyncIterable[Request] | Iterable[Request],
    ) -> grpc.aio.StreamUnaryCall[Request, Response]:
        return await continuation(self._bearer.add_to(client_call_details), request_iterator)


class _StreamStreamBearer(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, bearer: _BearerToken) -> None:
        self._bearer = bearer

    async def intercept_stream_stream(
        self,
        continuation: Callable[
            [grpc.aio.ClientCallDetails, AsyncIterable[Request] | Iterable[Request]],
            Awaitable[grpc.aio.StreamStreamCall[Request, Response]],
        ],
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: AsyncIterable[Request] | Iterable[Request],
    ) -> grpc.aio.StreamStreamCall[Request, Response]:
        return await continuation(self._bearer.add_to(client_call_details), request_iterator)


# -- where the token may go in clear -----------------------------------------------------------


def _is_loopback(target: str) -> bool:
    """Whether a target names this machine: localhost, a loopback address or a Unix socket."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    host = target.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    if host.startswith("["):  # [::1]:7070
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:  # host:port; more colons is a bare IPv6 address
        host = host.partition(":")[0]
    return is_loopback_host(host)


__all__ = ["TOKEN_ENV", "load_token", "open_channel"]


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
