"""A node with tokens and mutual TLS, on both backends: what gets through and what does not.

Certificates are made in the test (tls_certs); the connections are real TLS.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from secured_nodes import secured_node
from tls_certs import new_authority

from fastlane.auth.tls import ClientTls
from fastlane.domain.models import RunState, Schedule
from fastlane.errors import RemoteError
from fastlane.worker import RunContext, Worker

WAIT = 20.0


@pytest.fixture
async def mtls(db_url, tmp_path: Path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)
    ca, stranger = new_authority("fastlane test CA"), new_authority("someone else's CA")
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "server", "server-key", "client", "client-key",
                                                          "stranger", "stranger-client", "stranger-key")}
    files["ca"].write_bytes(ca.cert_pem)
    files["stranger"].write_bytes(stranger.cert_pem)
    ca.issue_server().write(files["server"], files["server-key"])
    ca.issue_client().write(files["client"], files["client-key"])
    stranger.issue_client().write(files["stranger-client"], files["stranger-key"])
    good = ClientTls(ca_file=files["ca"], cert_file=files["client"], key_file=files["client-key"])
    async with secured_node(db_url, client_tls=good, tls_cert=files["server"], tls_key=files["server-key"],
                            tls_client_ca=files["ca"]) as node:
        yield node, files


async def test_a_client_and_a_worker_with_certificates_and_tokens_run_a_job(mtls):
    node, _ = mtls
    worker = Worker(node.address, concurrency=4, follow_cluster=False, token=node.secrets["worker-a"],
                    tls=node.client_tls)
    ran = asyncio.Event()

    @worker.handler("t")
    async def handle(ctx: RunContext) -> None:
        ran.set()

    task = asyncio.create_task(worker.run())
    try:
        async with node.client("client-a") as client:
            job = await client.create("over-mtls", "t", Schedule.interval(timedelta(hours=1)))
            run = await client.trigger_job(job.job_id)
            await asyncio.wait_for(ran.wait(), WAIT)
            async with asyncio.timeout(WAIT):
                while (await client.get_run(run.run_id))[0].state is not RunState.SUCCEEDED:
                    await asyncio.sleep(0.05)
    finally:
        await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(task, WAIT)


@pytest.mark.parametrize("who", ["no client certificate", "a certificate of another CA", "trusting another CA"])
async def test_a_connection_without_the_right_certificates_is_refused(mtls, who):
    node, files = mtls
    tls = {
        "no client certificate": ClientTls(ca_file=files["ca"]),
        "a certificate of another CA": ClientTls(ca_file=files["ca"], cert_file=files["stranger-client"],
                                                 key_file=files["stranger-key"]),
        "trusting another CA": ClientTls(ca_file=files["stranger"], cert_file=files["client"],
                                         key_file=files["client-key"]),
    }[who]
    async with node.client("admin", tls=tls) as client:
        with pytest.raises(RemoteError) as refused:
            await client.list_jobs()
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE


async def test_the_right_certificates_without_a_token_are_unauthenticated(mtls):
    node, _ = mtls
    async with node.client(None) as client:
        with pytest.raises(RemoteError) as refused:
            await client.list_jobs()
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED


async def test_a_worker_that_cannot_verify_the_node_says_so_once(mtls, caplog):
    node, files = mtls
    wrong_ca = ClientTls(ca_file=files["stranger"], cert_file=files["client"], key_file=files["client-key"])
    worker = Worker(node.address, concurrency=1, follow_cluster=False, token=node.secrets["worker-a"], tls=wrong_ca)

    @worker.handler("t")
    async def handle(ctx: RunContext) -> None:
        raise AssertionError("a worker that cannot connect runs nothing")

    caplog.set_level("DEBUG", logger="fastlane.worker")
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(WAIT):  # three failed attempts, and still one line
            while not any("(attempt 3," in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.05)
    finally:
        await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(task, WAIT)
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and "TLS" in r.getMessage()]
    assert len(lines) == 1 and "--tls-ca" in lines[0]
