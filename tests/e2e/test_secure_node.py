"""A node with ``--auth`` and mutual TLS, driven as an operator would: real processes, the CLI.

The first admin token comes straight from the database (``fastlane tokens create --db``); from
then on everything goes through the node over mutual TLS: tokens for tenant ``acme``, a worker
process, a job created and run. Refusals are checked twice, on the wire (the status code a
:class:`~fastlane.client.Client` gets) and as a user meets them (the CLI's exit code and its one
line naming the reason). Last, the node's certificate is replaced on disk while it runs and new
connections get the new one, without a restart.

Certificates are made here (:mod:`tls_certs`, shared with the integration tests). The node
listens on 127.0.0.1 only; its health service alone is served in plain gRPC on another port
(``--health``), which is how the test knows the node is ready, as a Kubernetes probe would.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import pytest
from e2e_support import Recorder, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastlane.auth.tls import ClientTls
from fastlane.client import Client
from fastlane.domain.models import Schedule
from fastlane.errors import RemoteError
from fastlane.testing.processes import ROOT, Daemon, child_environment, free_port

# The certificate factory lives with the TLS integration tests; import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from tls_certs import Authority, Issued, new_authority, serial_of  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

TENANT = "acme"
CLI_TIMEOUT = 30.0  # one CLI call; they take well under a second
CALL_TIMEOUT = 5.0
READY_TIMEOUT = 30.0


# -- certificates --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """The node's CA with a server and a client certificate, and an unrelated CA with its own client
    certificate, as PEM files in ``directory``."""

    directory: Path
    ca: Authority
    server: Issued
    stranger: Issued  # a client certificate signed by the unrelated CA

    def path(self, name: str) -> Path:
        return self.directory / name


def make_pki(directory: Path) -> Pki:
    ca, other_ca = new_authority("fastlane e2e CA"), new_authority("unrelated CA")
    pki = Pki(directory=directory, ca=ca, server=ca.issue_server(), stranger=other_ca.issue_client())
    pki.path("ca.pem").write_bytes(ca.cert_pem)
    pki.path("other-ca.pem").write_bytes(other_ca.cert_pem)
    pki.server.write(pki.path("server.crt"), pki.path("server.key"))
    ca.issue_client("e2e-client").write(pki.path("client.crt"), pki.path("client.key"))
    pki.stranger.write(pki.path("stranger.crt"), pki.path("stranger.key"))
    return pki


def served_serial(address: str, pki: Pki, trusted_ca: Path) -> int:
    """The serial of the certificate the node presents to a new connection, verified against
    ``trusted_ca`` (the node requires a client certificate: we present ours)."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(trusted_ca))
    context.load_cert_chain(pki.path("client.crt"), pki.path("client.key"))
    context.set_alpn_protocols(["h2"])  # gRPC servers speak HTTP/2 only
    with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT) as raw, \
            context.wrap_socket(raw, server_hostname=host) as connection:
        certificate = connection.getpeercert(binary_form=True)
    assert certificate is not None
    return serial_of(certificate)


# -- the CLI, as a user runs it --------------------------------------------------------------------


def cli_environment() -> dict[str, str]:
    """The test's environment without a token or server of the user's: only flags count."""
    env = child_environment()
    for name in ("FASTLANE_TOKEN", "FASTLANE_SERVER"):
        env.pop(name, None)
    return env


def fastlane(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastlane", *map(str, args)],
        capture_output=True, text=True, env=cli_environment(), cwd=ROOT, timeout=CLI_TIMEOUT, check=False,
    )


def fastlane_json(*args: str | Path) -> object:
    """``fastlane ARGS --json``, which must succeed; its output parsed."""
    completed = fastlane(*args, "--json")
    assert completed.returncode == 0, f"fastlane {' '.join(map(str, args))}: {completed.stderr}"
    return orjson.loads(completed.stdout)


# -- the node ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SecureNode:
    """A running ``fastlane serve --auth`` with mutual TLS, and token files of each role."""

    daemon: Daemon
    health_address: str
    pki: Pki
    tokens: dict[str, Path]  # role -> file holding a token of that role (admin: tenant ops, others: acme)

    @property
    def address(self) -> str:
        return self.daemon.address

    def tls_flags(self, *, ca: str = "ca.pem", cert: str | None = "client") -> list[str]:
        """``--server`` and the TLS flags of a client trusting ``ca``, presenting ``cert``.crt/.key."""
        flags = ["--server", self.address, "--tls-ca", str(self.pki.path(ca))]
        if cert is not None:
            flags += ["--tls-cert", str(self.pki.path(f"{cert}.crt")), "--tls-key", str(self.pki.path(f"{cert}.key"))]
        return flags

    def as_role(self, role: str) -> list[str]:
        """Every flag a CLI call over mutual TLS needs, with a token of ``role``."""
        return [*self.tls_flags(), "--token-file", str(self.tokens[role])]

    def client_tls(self, *, ca: str = "ca.pem", cert: str | None = "client") -> ClientTls:
        if cert is None:
            return ClientTls(ca_file=self.pki.path(ca))
        return ClientTls(ca_file=self.pki.path(ca), cert_file=self.pki.path(f"{cert}.crt"),
                         key_file=self.pki.path(f"{cert}.key"))

    def token(self, role: str) -> str:
        return self.tokens[role].read_text().strip()


def write_token(path: Path, secret: str) -> Path:
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


def wait_serving(node: Daemon, health_address: str) -> None:
    """Until the node says SERVING on its plain health port; fails early if the node exits."""
    deadline = time.monotonic() + READY_TIMEOUT
    with grpc.insecure_channel(health_address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check  # type: ignore[attr-defined]
        while True:
            assert node.popen is not None and node.popen.poll() is None, f"the node exited:\n{node.log_tail()}"
            try:
                if check(health_pb2.HealthCheckRequest(), timeout=1.0).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass  # not listening yet
            assert time.monotonic() < deadline, f"not serving within {READY_TIMEOUT:g} s:\n{node.log_tail()}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureNode]:
    directory = tmp_path_factory.mktemp("secure-node")
    pki = make_pki(directory)
    db_url = f"sqlite:///{directory}/fastlane.db"

    # The first admin token: straight into the database, before any node runs.
    admin = fastlane_json("tokens", "create", "--db", db_url, "--tenant", "ops", "--role", "admin")
    assert isinstance(admin, dict) and admin["role"] == "admin" and admin["tenant"] == "ops"
    tokens = {"admin": write_token(directory / "admin.token", admin["secret"])}

    # Three ports picked one after another: make sure the third is not one of the first two.
    daemon = Daemon(db_url, directory / "daemon.log")
    taken = {daemon.address, daemon.metrics_address}
    while (health_address := f"127.0.0.1:{free_port()}") in taken:
        pass
    daemon.argv += [
        "--auth", "--tls-cert", str(pki.path("server.crt")), "--tls-key", str(pki.path("server.key")),
        "--tls-client-ca", str(pki.path("ca.pem")), "--health", health_address,
    ]
    daemon.start()
    try:
        wait_serving(daemon, health_address)
        secure = SecureNode(daemon=daemon, health_address=health_address, pki=pki, tokens=tokens)
        # The admin token, over mutual TLS, makes the tenant's tokens.
        for role in ("worker", "client", "viewer"):
            created = fastlane_json("tokens", "create", "--tenant", TENANT, "--role", role, "--name", f"e2e {role}",
                                    *secure.as_role("admin"))
            assert isinstance(created, dict) and (created["tenant"], created["role"]) == (TENANT, role)
            tokens[role] = write_token(directory / f"{role}.token", created["secret"])
        yield secure
    finally:
        code = daemon.stop()  # SIGTERM, then SIGKILL if it has not exited in time
    assert code == 0, f"the node did not stop cleanly (exit {code}):\n{daemon.log_tail()}"


# -- a job runs, end to end, over mutual TLS -------------------------------------------------------


async def test_a_worker_runs_a_job_created_with_the_cli_over_mutual_tls(node: SecureNode, tmp_path: Path) -> None:
    worker = Recorder(node.address, tmp_path / "received.jsonl", tmp_path / "worker.log")
    worker.argv += [*node.tls_flags(), "--token-file", str(node.tokens["worker"])]
    worker.env.pop("FASTLANE_TOKEN", None)
    worker.start()
    try:
        job = fastlane_json("jobs", "create", "--name", "secure-now", "--type", "e2e", "--now", *node.as_role("client"))
        assert isinstance(job, dict) and job["tenant"] == TENANT

        def succeeded_runs() -> list[dict]:
            runs = fastlane_json("runs", "list", "--job", job["job_id"], *node.as_role("client"))
            assert isinstance(runs, list)
            return [run for run in runs if run["state"] == "succeeded"]

        [run] = await wait_for(succeeded_runs, 20, "the run to succeed", interval=0.1)
        [received] = worker.received_for(job["job_id"])
        assert received["run_id"] == run["run_id"] and received["attempt"] == 1
        # The worker acts for its token's tenant, whatever it calls itself.
        assert run["tenant"] == TENANT and run["worker_id"].startswith(f"{TENANT}#")
    finally:
        worker.stop()
    assert "Traceback" not in worker.log_path.read_text(), worker.log_tail()


# -- refusals: on the wire, and as the CLI reports them --------------------------------------------


@dataclass(frozen=True)
class Refusal:
    ca: str = "ca.pem"
    cert: str | None = "client"
    role: str | None = "client"
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    says: tuple[str, ...] = ()  # what the CLI's message must mention


REFUSALS = {
    "no-client-certificate": Refusal(
        cert=None, says=("could not establish a TLS connection", "requires a client certificate", "--tls-cert")),
    "client-certificate-from-another-ca": Refusal(
        cert="stranger", says=("could not establish a TLS connection", "did not accept the client certificate")),
    "server-certificate-from-an-untrusted-ca": Refusal(
        ca="other-ca.pem", says=("could not establish a TLS connection", "certificate was not accepted", "--tls-ca")),
    "valid-certificate-but-no-token": Refusal(
        role=None, code=grpc.StatusCode.UNAUTHENTICATED,
        says=("requires an API token", "FASTLANE_TOKEN", "--token-file")),
    "viewer-token-creates-a-job": Refusal(
        role="viewer", code=grpc.StatusCode.PERMISSION_DENIED,
        says=("permission denied", "a viewer token may not call CreateJob")),
}


@pytest.mark.parametrize("case", list(REFUSALS))
async def test_a_refused_caller_creates_nothing_and_the_cli_says_why(
    node: SecureNode, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusal = REFUSALS[case]
    name = f"refused-{case}"
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)  # Client(token=None) would fall back to it

    # On the wire: the status code a client gets.
    token = node.token(refusal.role) if refusal.role is not None else None
    async with Client(node.address, token=token, tls=node.client_tls(ca=refusal.ca, cert=refusal.cert),
                      timeout=CALL_TIMEOUT) as client:
        with pytest.raises(RemoteError) as refused:
            await client.create(name, "e2e", Schedule.now())
    assert refused.value.code is refusal.code, refused.value

    # As a user meets it: a non-zero exit and one line that says why, no traceback.
    flags = [*node.tls_flags(ca=refusal.ca, cert=refusal.cert), "--rpc-timeout", str(CALL_TIMEOUT)]
    if refusal.role is not None:
        flags += ["--token-file", str(node.tokens[refusal.role])]
    completed = fastlane("jobs", "create", "--name", name, "--type", "e2e", "--now", *flags)
    assert completed.returncode == 1, completed
    assert completed.stdout == ""
    assert "Traceback" not in completed.stderr
    [message] = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    for words in refusal.says:
        assert words in message, f"{words!r} not in {message!r}"

    # Nothing was created.
    async with Client(node.address, token=node.token("client"), tls=node.client_tls(), timeout=CALL_TIMEOUT) as client:
        assert name not in [job.name for job in (await client.list_jobs()).items]


async def test_the_health_port_answers_without_tls_or_token_and_serves_nothing_else(
    node: SecureNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)
    async with Client(node.health_address, token=None, timeout=CALL_TIMEOUT) as client:
        await client.wait_ready(CALL_TIMEOUT)
        with pytest.raises(RemoteError) as refused:
            await client.cluster()
    assert refused.value.code is grpc.StatusCode.UNIMPLEMENTED


# -- rotation --------------------------------------------------------------------------------------


def test_a_certificate_replaced_on_disk_is_served_to_new_connections_without_a_restart(node: SecureNode) -> None:
    pid = node.daemon.pid
    # A certificate from a CA nothing trusted before: a client that trusts only the new CA can
    # connect only if it is handed the new certificate.
    rotated_ca = new_authority("rotated e2e CA")
    node.pki.path("rotated-ca.pem").write_bytes(rotated_ca.cert_pem)
    rotated = rotated_ca.issue_server()
    assert served_serial(node.address, node.pki, node.pki.path("ca.pem")) != rotated.serial
    rotated.write(node.pki.path("server.crt"), node.pki.path("server.key"))
    try:
        assert served_serial(node.address, node.pki, node.pki.path("rotated-ca.pem")) == rotated.serial
        status = fastlane_json("cluster", *node.tls_flags(ca="rotated-ca.pem"), "--token-file", node.tokens["admin"])
        assert isinstance(status, dict) and status["nodes"]
        # A client that still trusts only the old CA is now turned away, and told why.
        stale = fastlane("cluster", *node.tls_flags(), "--token-file", node.tokens["admin"])
        assert stale.returncode == 1 and "certificate was not accepted" in stale.stderr, stale.stderr
    finally:
        # Back to a certificate of the original CA, for whichever test runs next.
        restored = node.pki.ca.issue_server()
        restored.write(node.pki.path("server.crt"), node.pki.path("server.key"))
    assert served_serial(node.address, node.pki, node.pki.path("ca.pem")) == restored.serial
    # The same process all along.
    assert node.daemon.pid == pid and node.daemon.popen is not None and node.daemon.popen.poll() is None
