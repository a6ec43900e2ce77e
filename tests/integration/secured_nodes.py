"""A node that requires API tokens, run in-process for the access tests (a helper module).

Kept out of conftest.py so that test modules import it by a name no other test folder uses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastlane.auth.issuing import issue_token
from fastlane.auth.tls import ClientTls
from fastlane.client import Client
from fastlane.domain.access import ApiToken, Role
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.storage import Store, open_store
from fastlane.testing.processes import free_port

ENGINE_SHARDS = 4  # the shard count of the in-process engines (see test_engine.start_engine)


@dataclass
class SecuredNode:
    """A running in-process node with ``--auth``, and tokens of each role made in its database."""

    node: Node
    store: Store
    address: str
    client_tls: ClientTls | None = None  # how its clients connect (None: plain TCP)
    secrets: dict[str, str] = field(default_factory=dict)  # "admin", "client-a", ... -> fl_... secret
    tokens: dict[str, ApiToken] = field(default_factory=dict)

    def client(self, who: str | None, *, tenant: str = "", token: str | None = None,
               tls: ClientTls | None = None) -> Client:
        """A client of ``who`` (a key of ``secrets``; None: no token at all), over the node's
        client TLS unless ``tls`` says otherwise."""
        return Client(self.address, tenant=tenant, timeout=10, tls=tls or self.client_tls,
                      token=token if token is not None else (self.secrets[who] if who else None))

    async def issue(self, who: str, tenant: str, role: Role, **options: Any) -> str:
        token, secret = await issue_token(self.store, tenant=tenant, role=role, name=who, **options)
        self.secrets[who], self.tokens[who] = str(secret), token
        return str(secret)


@contextlib.asynccontextmanager
async def secured_node(db_url: str, *, client_tls: ClientTls | None = None, **settings: Any) -> AsyncIterator[SecuredNode]:
    """A node requiring tokens (``settings`` added to its Settings, e.g. TLS), with tokens: admin
    (tenant ops), a client, a viewer and a worker of tenant ``a``, a client and a worker of ``b``."""
    address = f"127.0.0.1:{free_port()}"
    node = Node(Settings(db_url=db_url, listen=address, node_id="secured-node", shard_count=ENGINE_SHARDS, auth=True,
                         **settings))
    task = asyncio.create_task(node.run(), name="secured-node")
    store = open_store(db_url, shard_count=ENGINE_SHARDS)
    try:
        async with asyncio.timeout(30):
            while not node.ready.is_set():
                if task.done():
                    await task  # raises why it stopped
                await asyncio.sleep(0.02)
        secured = SecuredNode(node, store, address, client_tls=client_tls)
        await secured.issue("admin", "ops", Role.ADMIN)
        await secured.issue("client-a", "a", Role.CLIENT)
        await secured.issue("viewer-a", "a", Role.VIEWER)
        await secured.issue("worker-a", "a", Role.WORKER)
        await secured.issue("client-b", "b", Role.CLIENT)
        await secured.issue("worker-b", "b", Role.WORKER)
        yield secured
    finally:
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
        await store.close()


