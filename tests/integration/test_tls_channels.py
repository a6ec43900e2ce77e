"""TLS, mutual TLS, certificate rotation and bearer tokens, over real connections.

Each test starts a ``grpc.aio`` server on 127.0.0.1 with the standard health service and an echo
service that answers with the metadata it received, and dials it with
:func:`fastlane.rpc.channel.open_channel`. Certificates are made per test
(:mod:`tls_certs`). Which certificate a server presents is read off the wire with the :mod:`ssl`
module, on the server's own port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tls_certs import Authority, Issued, new_authority, serial_of, write_atomically, write_kubernetes_secret

from fastlane.auth.tls import ClientTls, ServerTls, channel_credentials, server_credentials
from fastlane.errors import ConfigurationError
from fastlane.rpc.channel import load_token, open_channel

pytestmark = pytest.mark.timeout(60)

CALL_TIMEOUT = 5.0
ECHO = "fastlane.test.Echo"
TOKEN = "fl_abcdefghijkl_0123456789abcdef"


# -- certificates on disk ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """A CA with a server and a client certificate, and an unrelated CA with a client certificate."""

    directory: Path
    ca: Authority
    other_ca: Authority
    server: Issued
    client: Issued
    stranger: Issued  # a client certificate signed by other_ca

    def path(self, name: str) -> Path:
        return self.directory / name

    def server_tls(self, *, mutual: bool = False) -> ServerTls:
        return ServerTls(
            cert_file=self.path("server.crt"),
            key_file=self.path("server.key"),
            client_ca_file=self.path("ca.pem") if mutual else None,
        )


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca, other_ca = new_authority("fastlane test CA"), new_authority("unrelated CA")
    pki = Pki(
        directory=tmp_path,
        ca=ca,
        other_ca=other_ca,
        server=ca.issue_server(),
        client=ca.issue_client(),
        stranger=other_ca.issue_client(),
    )
    pki.path("ca.pem").write_bytes(ca.cert_pem)
    pki.path("other-ca.pem").write_bytes(other_ca.cert_pem)
    pki.server.write(pki.path("server.crt"), pki.path("server.key"))
    pki.client.write(pki.path("client.crt"), pki.path("client.key"))
    pki.stranger.write(pki.path("stranger.crt"), pki.path("stranger.key"))
    return pki


# -- the server --------------------------------------------------------------------------------


def _received_metadata(context: grpc.aio.ServicerContext) -> bytes:
    pairs = [[key, value] for key, value in context.invocation_metadata() or () if not key.startswith(("grpc-", ":"))
             and key != "user-agent"]
    return json.dumps(pairs).encode()


async def _unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return _received_metadata(context)


async def _server_stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    yield _received_metadata(context)


async def _client_stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    async for _ in requests:
        pass
    return _received_metadata(context)


async def _bidi(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    async for _ in requests:
        yield _received_metadata(context)


ECHO_HANDLER = grpc.method_handlers_generic_handler(ECHO, {
    "Unary": grpc.unary_unary_rpc_method_handler(_unary),
    "ServerStream": grpc.unary_stream_rpc_method_handler(_server_stream),
    "ClientStream": grpc.stream_unary_rpc_method_handler(_client_stream),
    "Bidi": grpc.stream_stream_rpc_method_handler(_bidi),
})


@contextlib.asynccontextmanager
async def serving(credentials: grpc.ServerCredentials | None = None) -> AsyncIterator[str]:
    """A server on 127.0.0.1 (TLS with ``credentials``, else plain), stopped on the way out."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_generic_rpc_handlers((ECHO_HANDLER,))
    listen = "127.0.0.1:0"
    port = server.add_insecure_port(listen) if credentials is None else server.add_secure_port(listen, credentials)
    assert port > 0
    await server.start()
    try:
        yield f"localhost:{port}"
    finally:
        await server.stop(None)


# -- what a client sees ------------------------------------------------------------------------


async def health_code(target: str, *, tls: ClientTls | None = None) -> grpc.StatusCode:
    """The status of one health check on a new channel (OK if the node said SERVING)."""
    async with open_channel(target, tls=tls) as channel:
        try:
            response = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            return error.code()
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    return grpc.StatusCode.OK


async def served_serial(target: str, trusted: Authority) -> int:
    """The serial of the certificate the server presents to a new connection, checked against ``trusted``."""
    host, _, port = target.rpartition(":")
    context = ssl.create_default_context(cadata=trusted.cert_pem.decode())
    context.set_alpn_protocols(["h2"])
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", int(port), ssl=context, server_hostname=host), CALL_TIMEOUT)
    try:
        return serial_of(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
    finally:
        # Not close(): a TLS close waits for the peer's close_notify, and a gRPC server that has
        # not seen an HTTP/2 preface never sends one.
        writer.transport.abort()


async def echoes(channel: grpc.aio.Channel, metadata: grpc.aio.Metadata | tuple[tuple[str, str], ...] = ()
                 ) -> dict[str, list[list[str]]]:
    """The metadata the server received, by call kind, with ``metadata`` passed on each call."""
    unary = await channel.unary_unary(f"/{ECHO}/Unary")(b"", timeout=CALL_TIMEOUT, metadata=metadata)
    server_stream = [reply async for reply in channel.unary_stream(f"/{ECHO}/ServerStream")(
        b"", timeout=CALL_TIMEOUT, metadata=metadata)]
    client_stream = await channel.stream_unary(f"/{ECHO}/ClientStream")(
        iter([b"a", b"b"]), timeout=CALL_TIMEOUT, metadata=metadata)
    # The worker's stream style: one call, written and read as it goes.
    bidi = channel.stream_stream(f"/{ECHO}/Bidi")(timeout=CALL_TIMEOUT, metadata=metadata)
    await bidi.write(b"hello")
    bidi_reply = await bidi.read()
    await bidi.done_writing()
    assert await bidi.read() is grpc.aio.EOF
    replies = {"unary": unary, "server_stream": server_stream[0], "client_stream": client_stream, "bidi": bidi_reply}
    return {kind: json.loads(reply) for kind, reply in replies.items()}


# -- TLS ---------------------------------------------------------------------------------------


async def test_a_client_trusting_the_ca_reaches_a_tls_node(pki: Pki) -> None:
    async with serving(server_credentials(pki.server_tls())) as target:
        assert await health_code(target, tls=ClientTls(ca_file=pki.path("ca.pem"))) == grpc.StatusCode.OK
        assert await served_serial(target, pki.ca) == pki.server.serial


async def test_a_client_trusting_another_ca_is_refused(pki: Pki) -> None:
    async with serving(server_credentials(pki.server_tls())) as target:
        assert await health_code(target, tls=ClientTls(ca_file=pki.path("other-ca.pem"))) == grpc.StatusCode.UNAVAILABLE


async def test_a_plaintext_client_cannot_talk_to_a_tls_node(pki: Pki) -> None:
    async with serving(server_credentials(pki.server_tls())) as target:
        assert await health_code(target) == grpc.StatusCode.UNAVAILABLE


# -- mutual TLS --------------------------------------------------------------------------------


async def test_mutual_tls_admits_a_client_certificate_from_the_client_ca(pki: Pki) -> None:
    tls = ClientTls(ca_file=pki.path("ca.pem"), cert_file=pki.path("client.crt"), key_file=pki.path("client.key"))
    async with serving(server_credentials(pki.server_tls(mutual=True))) as target:
        assert await health_code(target, tls=tls) == grpc.StatusCode.OK


async def test_mutual_tls_refuses_a_client_without_a_certificate(pki: Pki) -> None:
    async with serving(server_credentials(pki.server_tls(mutual=True))) as target:
        assert await health_code(target, tls=ClientTls(ca_file=pki.path("ca.pem"))) == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_refuses_a_client_certificate_from_another_ca(pki: Pki) -> None:
    tls = ClientTls(ca_file=pki.path("ca.pem"), cert_file=pki.path("stranger.crt"), key_file=pki.path("stranger.key"))
    async with serving(server_credentials(pki.server_tls(mutual=True))) as target:
        assert await health_code(target, tls=tls) == grpc.StatusCode.UNAVAILABLE


# -- rotation ----------------------------------------------------------------------------------


async def test_a_secret_volume_update_is_served_to_new_connections_without_restart(pki: Pki) -> None:
    secret = pki.path("secret")
    secret.mkdir()
    cert_file, key_file = write_kubernetes_secret(secret, pki.server, generation=1)
    trusting_ca = ClientTls(ca_file=pki.path("ca.pem"))
    async with serving(server_credentials(ServerTls(cert_file=cert_file, key_file=key_file))) as target:
        assert await served_serial(target, pki.ca) == pki.server.serial
        async with open_channel(target, tls=trusting_ca) as open_before:
            stub = health_pb2_grpc.HealthStub(open_before)
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT)

            renewed = pki.ca.issue_server()
            write_kubernetes_secret(secret, renewed, generation=2)

            assert await served_serial(target, pki.ca) == renewed.serial
            assert await health_code(target, tls=trusting_ca) == grpc.StatusCode.OK
            # The connection made before the rotation goes on with the certificate it has.
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT)


async def test_grpc_clients_get_the_rotated_certificate(pki: Pki) -> None:
    # Rotated to a certificate from another CA, so which one a gRPC client got shows in whether
    # it connects.
    async with serving(server_credentials(pki.server_tls())) as target:
        assert await health_code(target, tls=ClientTls(ca_file=pki.path("ca.pem"))) == grpc.StatusCode.OK

        pki.other_ca.issue_server().write(pki.path("server.crt"), pki.path("server.key"))

        assert await health_code(target, tls=ClientTls(ca_file=pki.path("other-ca.pem"))) == grpc.StatusCode.OK
        assert await health_code(target, tls=ClientTls(ca_file=pki.path("ca.pem"))) == grpc.StatusCode.UNAVAILABLE


async def test_a_half_written_rotation_keeps_the_previous_pair_and_warns_once(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fastlane.tls")
    async with serving(server_credentials(pki.server_tls())) as target:
        renewed = pki.ca.issue_server()
        write_atomically(pki.path("server.crt"), renewed.cert_pem)  # its key not written yet

        assert await served_serial(target, pki.ca) == pki.server.serial
        assert await health_code(target, tls=ClientTls(ca_file=pki.path("ca.pem"))) == grpc.StatusCode.OK
        warnings = [record for record in caplog.records if record.name == "fastlane.tls"]
        assert len(warnings) == 1, [record.getMessage() for record in warnings]
        assert "--tls-key" in warnings[0].getMessage()

        write_atomically(pki.path("server.key"), renewed.key_pem)

        assert await served_serial(target, pki.ca) == renewed.serial


# -- tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tls"])
async def test_the_token_rides_on_every_kind_of_call_beside_the_callers_metadata(pki: Pki, secure: bool) -> None:
    credentials = server_credentials(pki.server_tls()) if secure else None
    tls = ClientTls(ca_file=pki.path("ca.pem")) if secure else None
    async with serving(credentials) as target, open_channel(target, tls=tls, token=TOKEN) as channel:
        received = await echoes(channel, metadata=(("x-request-id", "r-1"),))
    for kind, metadata in received.items():
        assert ["authorization", f"Bearer {TOKEN}"] in metadata, kind
        assert ["x-request-id", "r-1"] in metadata, kind


async def test_no_token_sends_no_authorization() -> None:
    async with serving() as target, open_channel(target) as channel:
        received = await echoes(channel)
    assert all(key != "authorization" for metadata in received.values() for key, _ in metadata)


async def test_a_call_with_its_own_authorization_keeps_it_and_the_callers_metadata_is_not_changed() -> None:
    own = grpc.aio.Metadata(("authorization", "Bearer someone-else"))
    async with serving() as target, open_channel(target, token=TOKEN) as channel:
        received = await echoes(channel, metadata=own)
    for kind, metadata in received.items():
        assert [value for key, value in metadata if key == "authorization"] == ["Bearer someone-else"], kind
    assert list(own) == [("authorization", "Bearer someone-else")]


@pytest.mark.parametrize("token", ["", "two words", "line\nbreak", "é"])
def test_a_token_that_cannot_be_sent_is_refused_without_echoing_it(token: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        open_channel("127.0.0.1:1", token=token)
    if token:
        assert token not in str(refused.value)


async def test_a_token_sent_in_clear_beyond_this_machine_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fastlane.rpc")
    for target in ("127.0.0.1:7070", "localhost:7070", "[::1]:7070", "unix:/run/fastlane.sock"):
        await open_channel(target, token=TOKEN).close()  # a channel connects on its first call: none here
    assert caplog.records == []
    await open_channel("10.1.2.3:7070", token=TOKEN).close()
    assert [record.name for record in caplog.records] == ["fastlane.rpc"]
    assert TOKEN not in caplog.text


def test_load_token_reads_the_token_file_first(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}\n")
    assert load_token(token_file, environ={"FASTLANE_TOKEN": "from-env"}) == TOKEN


def test_load_token_falls_back_to_the_environment_then_to_none() -> None:
    assert load_token(environ={"FASTLANE_TOKEN": f"{TOKEN}\n"}) == TOKEN
    assert load_token(environ={"FASTLANE_TOKEN": "  "}) is None
    assert load_token(environ={}) is None


@pytest.mark.parametrize("content", [None, "", "\n"], ids=["missing", "empty", "blank"])
def test_load_token_refuses_a_token_file_it_cannot_use(tmp_path: Path, content: str | None) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    with pytest.raises(ConfigurationError, match="--token-file"):
        load_token(token_file, environ={"FASTLANE_TOKEN": TOKEN})


# -- configuration errors ----------------------------------------------------------------------


@pytest.mark.parametrize(("missing", "flag"), [
    ("server.crt", "--tls-cert"), ("server.key", "--tls-key"), ("ca.pem", "--tls-client-ca"),
])
def test_a_missing_server_file_is_named_by_its_option(pki: Pki, missing: str, flag: str) -> None:
    pki.path(missing).unlink()
    with pytest.raises(ConfigurationError, match=flag):
        server_credentials(pki.server_tls(mutual=True))


def test_a_key_that_does_not_belong_to_the_certificate_is_refused_at_start(pki: Pki) -> None:
    pki.path("server.key").write_bytes(pki.client.key_pem)
    with pytest.raises(ConfigurationError, match="--tls-key.*does not belong"):
        server_credentials(pki.server_tls())


def test_a_certificate_file_without_a_certificate_is_refused_at_start(pki: Pki) -> None:
    pki.path("server.crt").write_bytes(pki.server.key_pem)
    with pytest.raises(ConfigurationError, match="--tls-cert"):
        server_credentials(pki.server_tls())


@pytest.mark.parametrize(("given", "missing"), [("cert_file", "--tls-key"), ("key_file", "--tls-cert")])
def test_a_client_certificate_needs_its_key_and_the_other_way_round(pki: Pki, given: str, missing: str) -> None:
    with pytest.raises(ConfigurationError, match=f"without {missing}"):
        ClientTls(**{given: pki.path("client.crt")})


def test_a_missing_client_ca_is_named_by_its_option(pki: Pki) -> None:
    with pytest.raises(ConfigurationError, match="--tls-ca"):
        channel_credentials(ClientTls(ca_file=pki.path("nowhere.pem")))
