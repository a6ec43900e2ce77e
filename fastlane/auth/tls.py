"""TLS for the API: server credentials that follow certificate rotation, and client credentials.

Server side, :func:`server_credentials` builds ``grpc.dynamic_ssl_server_credentials``. gRPC core
calls its fetcher before every TLS handshake, that is once per new connection; the fetcher stats
the certificate, key and client CA files and, only when one of them changed, reads them again and
hands gRPC the new pair. A certificate rotated on disk is therefore served to new connections
without a restart; connections already open keep the certificate they were made with.

- Files are compared by ``os.stat`` of the path, which follows symlinks: Kubernetes updates a
  Secret volume by pointing a ``..data`` symlink at a new directory, so the file a path leads to
  gets a new inode even when size and times look alike. The stamp is device, inode, size, mtime
  and ctime.
- A rotation is rarely atomic across files (a certificate written before its key, a copy in
  progress). The fetcher only hands gRPC a set it has checked itself: every file readable, the
  certificates parse, the key belongs to the certificate, and no file changed while it was being
  read. Otherwise it keeps the previous set, logs one warning per distinct state of the files,
  and tries again on the next handshake. It never raises into gRPC.
- The key and certificate are checked with the standard :mod:`ssl` module, which reads from paths
  only; hence the check that the files did not change between that read and ours.

Verified to work with ``grpc.aio``: ``grpc.aio.Server.add_secure_port`` hands the same core
credentials object to the core server as the synchronous server does (``AioServer`` ->
``grpc_server_add_http2_port``), and the fetcher is a core security-connector callback
(``try_fetch_ssl_server_credentials``), independent of the Python I/O layer. The rotation tests in
``tests/integration/test_tls_channels.py`` replace the files under a running ``grpc.aio`` server
and observe the new certificate on the wire. The fetcher runs on a gRPC core thread with the GIL
kept, so it is quick (three ``stat`` calls when nothing changed), takes its own lock, and touches
no event loop.

Client side, :func:`channel_credentials` turns a :class:`ClientTls` into channel credentials; a
channel's credentials are fixed, so a rotated client certificate is used by channels opened after
the change. :func:`fastlane.rpc.channel.open_channel` is the usual way to use them.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import grpc

from fastlane.errors import ConfigurationError

log = logging.getLogger("fastlane.tls")

# The option each file comes from, so that an error names what the operator typed.
SERVER_CERT_FLAG = "--tls-cert"
SERVER_KEY_FLAG = "--tls-key"
SERVER_CLIENT_CA_FLAG = "--tls-client-ca"
CLIENT_CA_FLAG = "--tls-ca"
CLIENT_CERT_FLAG = "--tls-cert"
CLIENT_KEY_FLAG = "--tls-key"

_START_ATTEMPTS = 3  # reads at start that may meet a rotation in progress before giving up


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerTls:
    """Where a node finds its TLS certificate, and whether it requires client certificates.

    Attributes:
        cert_file: PEM certificate chain, the node's certificate first (``--tls-cert``).
        key_file: PEM private key of that certificate, not encrypted (``--tls-key``).
        client_ca_file: PEM certificates of the CAs that sign client certificates
            (``--tls-client-ca``). When set, TLS is mutual: every client must present a
            certificate that one of them signed, or the handshake fails.
    """

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientTls:
    """How a client checks the node's certificate, and the certificate it presents for mTLS.

    Attributes:
        ca_file: PEM certificates of the CAs trusted to sign the node's certificate (``--tls-ca``);
            None trusts gRPC's default roots (its bundled set, or the file named by
            ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``).
        cert_file: PEM certificate chain presented to a node that requires client certificates
            (``--tls-cert``).
        key_file: PEM private key of ``cert_file``, not encrypted (``--tls-key``).

    Raises:
        ConfigurationError: Only one of ``cert_file`` and ``key_file`` was given.
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = (
                (CLIENT_CERT_FLAG, CLIENT_KEY_FLAG) if self.key_file is None else (CLIENT_KEY_FLAG, CLIENT_CERT_FLAG)
            )
            raise ConfigurationError(
                f"{given} was given without {missing}: a client certificate goes with its private key, give both or neither"
            )


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials for ``grpc.aio.Server.add_secure_port`` that follow rotation of the files.

    The files are read and checked now, so a node with a bad configuration stops at start with a
    message naming the option; afterwards a change on disk is picked up at the next new
    connection, and a set of files that cannot be used is logged and ignored (see the module
    docstring).

    Raises:
        ConfigurationError: A file is missing or unreadable, is not PEM, or the key does not
            belong to the certificate.
    """
    loaded = _load_at_start(tls)
    reload = _CertificateReload(tls, served=loaded.stamps)
    return grpc.dynamic_ssl_server_credentials(
        loaded.configuration,
        # types-grpcio declares the fetcher as never returning None; gRPC documents None as "no
        # change, keep the current configuration", which is what it returns on most handshakes.
        reload,  # type: ignore[arg-type]
        require_client_authentication=tls.client_ca_file is not None,
    )


def channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    """Channel credentials for ``grpc.aio.secure_channel``, from files read and checked now.

    Raises:
        ConfigurationError: A file is missing or unreadable, is not PEM, or the key does not
            belong to the certificate.
    """
    root_certificates = None
    if tls.ca_file is not None:
        root_certificates = _read(tls.ca_file, CLIENT_CA_FLAG)
        _check_certificates(root_certificates, tls.ca_file, CLIENT_CA_FLAG)
    private_key = certificate_chain = None
    if tls.cert_file is not None and tls.key_file is not None:
        certificate_chain = _read(tls.cert_file, CLIENT_CERT_FLAG)
        private_key = _read(tls.key_file, CLIENT_KEY_FLAG)
        _check_certificates(certificate_chain, tls.cert_file, CLIENT_CERT_FLAG)
        _check_key_pair(tls.cert_file, tls.key_file, cert_flag=CLIENT_CERT_FLAG, key_flag=CLIENT_KEY_FLAG)
    return grpc.ssl_channel_credentials(
        root_certificates=root_certificates, private_key=private_key, certificate_chain=certificate_chain
    )


# -- reloading ---------------------------------------------------------------------------------

# What the file a path leads to looks like: (device, inode, size, mtime_ns, ctime_ns), or None when
# it cannot be stat'ed (missing mid-rotation, say).
_Stamp = tuple[int, int, int, int, int] | None
_Stamps = tuple[_Stamp, ...]


class _FilesChanging(ConfigurationError):
    """The files changed while they were being read: a rotation in progress, worth another try."""


class _Loaded(NamedTuple):
    stamps: _Stamps  # of the files as they were read
    configuration: grpc.ServerCertificateConfiguration


class _CertificateReload:
    """The fetcher gRPC calls before each handshake: a new configuration, or None for "keep"."""

    def __init__(self, tls: ServerTls, *, served: _Stamps) -> None:
        self._tls = tls
        self._served = served
        self._refused: _Stamps | None = None  # the state last warned about, so each is logged once
        self._lock = threading.Lock()  # gRPC may call from several core threads

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            stamps = _stamps(self._tls)
            if stamps == self._served:
                return None
            try:
                loaded = _load_server_files(self._tls)
            except Exception as error:  # anything raised here would only reach gRPC's own log
                if stamps != self._refused:
                    self._refused = stamps
                    log.warning(
                        "the TLS files changed but cannot be used (yet); new connections keep the previous "
                        "certificate, and the files are read again at the next one: %s", error,
                        exc_info=not isinstance(error, ConfigurationError),  # a bug, not a rotation
                    )
                return None
            self._served, self._refused = loaded.stamps, None
            log.info("serving the TLS certificate in %s to new connections", self._tls.cert_file)
            return loaded.configuration


def _stamps(tls: ServerTls) -> _Stamps:
    return tuple(_stamp(path) for path in _server_paths(tls))


def _stamp(path: Path) -> _Stamp:
    try:
        st = os.stat(path)  # follows symlinks: a swapped ..data link means another file
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _server_paths(tls: ServerTls) -> tuple[Path, ...]:
    return (tls.cert_file, tls.key_file) if tls.client_ca_file is None else (tls.cert_file, tls.key_file, tls.client_ca_file)


def _load_at_start(tls: ServerTls) -> _Loaded:
    for _ in range(_START_ATTEMPTS - 1):
        try:
            return _load_server_files(tls)
        except _FilesChanging:
            continue
    return _load_server_files(tls)


def _load_server_files(tls: ServerTls) -> _Loaded:
    """Read and check the server's files, as one consistent set.

    Raises:
        _FilesChanging: A file changed while being read.
        ConfigurationError: A file cannot be read or used; the message names its option.
    """
    before = _stamps(tls)
    certificate_chain = _read(tls.cert_file, SERVER_CERT_FLAG)
    private_key = _read(tls.key_file, SERVER_KEY_FLAG)
    _check_certificates(certificate_chain, tls.cert_file, SERVER_CERT_FLAG)
    client_roots = None
    if tls.client_ca_file is not None:
        client_roots = _read(tls.client_ca_file, SERVER_CLIENT_CA_FLAG)
        _check_certificates(client_roots, tls.client_ca_file, SERVER_CLIENT_CA_FLAG)
    _check_key_pair(tls.cert_file, tls.key_file, cert_flag=SERVER_CERT_FLAG, key_flag=SERVER_KEY_FLAG)
    # The pair check read the files again, by path: it vouches for our bytes only if nothing moved.
    if _stamps(tls) != before:
        raise _FilesChanging("the TLS files changed while they were being read (a rotation in progress)")
    configuration = grpc.ssl_server_certificate_configuration(
        [(private_key, certificate_chain)], root_certificates=client_roots
    )
    return _Loaded(before, configuration)


# -- reading and checking files ----------------------------------------------------------------


class _EncryptedKey(Exception):
    """Raised from the password callback: gRPC cannot use a key that needs a passphrase."""


def _refuse_passphrase() -> bytes:
    # Without a callback, OpenSSL would prompt on the terminal for a passphrase.
    raise _EncryptedKey


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ConfigurationError(f"{flag} {path}: cannot read the file: {error.strerror or error}") from error


def _check_certificates(pem: bytes, path: Path, flag: str) -> None:
    """Raise unless ``pem`` holds at least one certificate in PEM form."""
    try:
        # Text outside the PEM blocks may be anything, but cadata must be ASCII; the blocks
        # themselves are base64, so dropping other bytes loses nothing that is parsed.
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii", "ignore"))
    except (ssl.SSLError, ValueError) as error:
        raise ConfigurationError(f"{flag} {path}: no PEM certificate could be read from it ({error})") from error


def _check_key_pair(cert_file: Path, key_file: Path, *, cert_flag: str, key_flag: str) -> None:
    """Raise unless the key file holds an unencrypted PEM key that belongs to the certificate."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file, password=_refuse_passphrase)
    except _EncryptedKey as error:
        raise ConfigurationError(
            f"{key_flag} {key_file}: the private key is encrypted; gRPC needs it without a passphrase"
        ) from error
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ConfigurationError(
                f"{key_flag} {key_file}: the private key does not belong to the certificate in {cert_flag} {cert_file}"
            ) from error
        raise ConfigurationError(f"{key_flag} {key_file}: no usable PEM private key could be read from it ({error})") from error
    except OSError as error:  # a file removed since it was read
        raise ConfigurationError(f"{key_flag} {key_file}: cannot read the file: {error.strerror or error}") from error


__all__ = ["ClientTls", "ServerTls", "channel_credentials", "server_credentials"]
