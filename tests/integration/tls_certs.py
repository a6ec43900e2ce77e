"""Certificates for the TLS tests, made in Python: CAs, server and client certificates, PEM files.

A plain helper module (imported by basename, as ``tests/unit/debian_cron.py`` is), not a test.
EC P-256 keys: quick to generate, and gRPC's TLS stack takes them as it takes RSA.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = timedelta(days=1)
_BACKDATE = timedelta(hours=1)  # tolerate a clock a little behind the one that signed


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, in PEM."""

    cert_pem: bytes
    key_pem: bytes
    serial: int

    def write(self, cert_file: Path, key_file: Path) -> None:
        """Write both files, each replaced atomically as a rotation tool would."""
        write_atomically(cert_file, self.cert_pem)
        write_atomically(key_file, self.key_pem)


@dataclass(frozen=True)
class Authority:
    """A self-signed CA that issues server and client certificates."""

    name: str
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue_server(self, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Issued:
        """A server certificate valid for ``hosts`` (names and IP addresses, as SANs)."""
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        return self._issue(hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, names)

    def issue_client(self, name: str = "test-client") -> Issued:
        """A client certificate for mutual TLS."""
        return self._issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName(name)])

    def _issue(self, common_name: str, usage: x509.ObjectIdentifier, names: list[x509.GeneralName]) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        serial = x509.random_serial_number()
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        return Issued(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key), serial=serial)


def new_authority(name: str) -> Authority:
    """A fresh self-signed CA named ``name``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(name=name, cert=cert, key=key)


def serial_of(der_cert: bytes) -> int:
    """The serial number of a DER certificate (as ``ssl`` hands over a peer's)."""
    return x509.load_der_x509_certificate(der_cert).serial_number


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by a new file holding ``data``, never showing a partial file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_kubernetes_secret(directory: Path, issued: Issued, generation: int) -> tuple[Path, Path]:
    """Lay ``issued`` out as the kubelet does a TLS Secret volume, and swap it in atomically.

    ``tls.crt -> ..data/tls.crt`` and ``..data -> ..<generation>``: an update writes a new
    versioned directory, renames a new ``..data`` link over the old one and removes the old
    directory, so the files behind the stable paths change all at once.

    Returns:
        The stable certificate and key paths.
    """
    version = directory / f"..generation_{generation}"
    version.mkdir()
    (version / "tls.crt").write_bytes(issued.cert_pem)
    (version / "tls.key").write_bytes(issued.key_pem)
    data = directory / "..data"
    previous = data.resolve() if data.is_symlink() else None
    staged = directory / "..data_tmp"
    staged.symlink_to(version.name)
    os.replace(staged, data)
    if previous is not None:
        for file in previous.iterdir():
            file.unlink()
        previous.rmdir()
    for name in ("tls.crt", "tls.key"):
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    return directory / "tls.crt", directory / "tls.key"
