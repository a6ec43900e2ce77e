"""``--secure``: the fastlane run again with TLS and an API token, to measure what they cost.

A throwaway CA and a server certificate for 127.0.0.1 are made for the run (``cryptography``,
in the bench extra), the node is started with ``--auth --tls-cert --tls-key``, the worker with a
worker token and the CA, and the harness itself speaks TLS with an admin token.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastlane.auth.issuing import issue_token
from fastlane.auth.tls import ClientTls
from fastlane.domain.access import Role
from fastlane.domain.models import DEFAULT_TENANT
from fastlane.storage import open_store


@dataclass(frozen=True)
class Secured:
    """The files and tokens of a secured run."""

    ca: Path
    cert: Path
    key: Path
    admin_token: str
    worker_token_file: Path

    def node_args(self) -> list[str]:
        return ["--auth", "--tls-cert", str(self.cert), "--tls-key", str(self.key)]

    def worker_args(self) -> list[str]:
        return ["--token-file", str(self.worker_token_file), "--tls-ca", str(self.ca)]

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`fastlane.client.Client` for the harness's own calls."""
        return {"token": self.admin_token, "tls": ClientTls(ca_file=self.ca)}


async def secure(db_url: str, directory: Path) -> Secured:
    """Certificates in ``directory``, and an admin and a worker token in the (migrated) database."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, cert, key = _certificates(directory)
    store = open_store(db_url)
    try:
        await store.migrate()
        _, admin = await issue_token(store, tenant="bench", role=Role.ADMIN, name="bench harness")
        _, worker = await issue_token(store, tenant=DEFAULT_TENANT, role=Role.WORKER, name="bench worker")
    finally:
        await store.close()
    token_file = directory / "worker.token"
    token_file.write_text(str(worker))
    token_file.chmod(0o600)
    return Secured(ca=ca, cert=cert, key=key, admin_token=str(admin), worker_token_file=token_file)


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fastlane bench CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
               .not_valid_after(now + timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    server_cert = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
                   .issuer_name(ca_name).public_key(server_key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
                   .not_valid_after(now + timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                               x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths
