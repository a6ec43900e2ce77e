"""AdminService: what this node knows of the cluster, and API tokens.

What a caller sees of the cluster depends on its role (:func:`_view_of`): an admin (or anyone,
authentication off) sees it all; a worker the nodes with their addresses, which it dials to follow
the cluster's membership; a client or viewer the nodes without addresses. None but an admin sees
the shards (owners, fencing tokens, lease expiries), and the workers listed are the caller's
tenant's and those serving every tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import NamedTuple

import grpc

from fastlane._proto import admin_pb2, admin_pb2_grpc
from fastlane.auth.caller import current_caller
from fastlane.auth.issuing import issue_token
from fastlane.domain import validation
from fastlane.domain.access import Role
from fastlane.domain.limits import DEFAULT_SHARD_LEASE_TTL, MAX_NAME_LENGTH
from fastlane.domain.quotas import TenantQuota
from fastlane.rpc import wire
from fastlane.rpc.enums import ROLE
from fastlane.server.guard import rpc, tenant_of
from fastlane.server.quotas import QuotaGuard
from fastlane.storage import Store


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, store: Store, node_status: Callable[[], admin_pb2.NodeStatus], node_id: str,
                 live_within: timedelta = DEFAULT_SHARD_LEASE_TTL, *, quotas: QuotaGuard | None = None,
                 workers: Callable[[], Sequence[admin_pb2.WorkerStatus]] = tuple) -> None:
        self._store = store
        self._quotas = quotas
        self._node_status = node_status
        self._workers = workers
        self._node_id = node_id
        self._live_within = live_within

    @rpc
    async def GetCluster(
        self,
        request: admin_pb2.GetClusterRequest,
        context: grpc.aio.ServicerContext[admin_pb2.GetClusterRequest, admin_pb2.GetClusterResponse],
    ) -> admin_pb2.GetClusterResponse:
        view = _view_of()
        shards = await self._store.shards.list_shards() if view.shards else []
        now = await self._store.db_now()
        nodes = []
        for node in await self._store.shards.list_nodes():
            live = now - node.heartbeat_at <= self._live_within
            if node.node_id == self._node_id:
                status = self._node_status()
                status.heartbeat_at.CopyFrom(wire.timestamp(node.heartbeat_at))
                status.live = live
            else:
                status = admin_pb2.NodeStatus(
                    node_id=node.node_id, address=node.address, shards_owned=node.shards_owned,
                    workers_connected=node.workers, clock_offset_ms=node.clock_offset_ms, eligible=node.eligible,
                    note=node.note, heartbeat_at=wire.timestamp(node.heartbeat_at), live=live,
                )
            nodes.append(status)
        if not any(node.node_id == self._node_id for node in nodes):
            nodes.append(self._node_status())  # not yet heartbeaten
        if not view.addresses:
            for status in nodes:
                status.ClearField("address")
        return admin_pb2.GetClusterResponse(
            database_time=wire.timestamp(now),
            nodes=nodes,
            workers=[worker for worker in self._workers() if _may_see(worker)],
            shards=[
                admin_pb2.ShardStatus(shard_id=s.shard_id, owner=s.owner, token=s.token,
                                      lease_expires_at=wire.timestamp(s.lease_expires_at))
                for s in shards
            ],
        )

    # -- API tokens (admin tokens only: see fastlane.auth.roles) --------------------------------

    @rpc
    async def CreateToken(
        self,
        request: admin_pb2.CreateTokenRequest,
        context: grpc.aio.ServicerContext[admin_pb2.CreateTokenRequest, admin_pb2.CreateTokenResponse],
    ) -> admin_pb2.CreateTokenResponse:
        role = ROLE.member(request.role, "role", Role.VIEWER)
        expires_in = wire.duration_in("expires_in", request.expires_in) if request.HasField("expires_in") else None
        token, secret = await issue_token(
            self._store, tenant=request.tenant, role=role,
            name=validation.text("name", request.name, max_length=MAX_NAME_LENGTH), expires_in=expires_in,
        )
        return admin_pb2.CreateTokenResponse(token=wire.token_to_pb(token), secret=str(secret))

    @rpc
    async def ListTokens(
        self,
        request: admin_pb2.ListTokensRequest,
        context: grpc.aio.ServicerContext[admin_pb2.ListTokensRequest, admin_pb2.ListTokensResponse],
    ) -> admin_pb2.ListTokensResponse:
        tenant = validation.name("tenant", request.tenant) if request.tenant else None
        tokens = await self._store.tokens.list_tokens(tenant)
        return admin_pb2.ListTokensResponse(tokens=[wire.token_to_pb(token) for token in tokens])

    @rpc
    async def RevokeToken(
        self,
        request: admin_pb2.RevokeTokenRequest,
        context: grpc.aio.ServicerContext[admin_pb2.RevokeTokenRequest, admin_pb2.RevokeTokenResponse],
    ) -> admin_pb2.RevokeTokenResponse:
        token = await self._store.tokens.revoke_token(validation.identifier("token_id", request.token_id))
        return admin_pb2.RevokeTokenResponse(token=wire.token_to_pb(token))

    # -- quotas ----------------------------------------------------------------------------------

    @rpc
    async def GetQuota(
        self, request: admin_pb2.GetQuotaRequest,
        context: grpc.aio.ServicerContext[admin_pb2.GetQuotaRequest, admin_pb2.GetQuotaResponse],
    ) -> admin_pb2.GetQuotaResponse:
        return admin_pb2.GetQuotaResponse(quota=await self._status(tenant_of(request.tenant)))

    @rpc
    async def SetQuota(
        self, request: admin_pb2.SetQuotaRequest,
        context: grpc.aio.ServicerContext[admin_pb2.SetQuotaRequest, admin_pb2.SetQuotaResponse],
    ) -> admin_pb2.SetQuotaResponse:
        tenant = validation.name("tenant", request.tenant)
        override = None if request.reset else wire.quota_from_pb(request.override).validated()
        await self._store.quotas.set_quota_override(tenant, override)
        if self._quotas is not None:
            self._quotas.overrides_changed()
        return admin_pb2.SetQuotaResponse(quota=await self._status(tenant))

    async def _status(self, tenant: str) -> admin_pb2.QuotaStatus:
        override = (await self._store.quotas.list_quota_overrides()).get(tenant, TenantQuota())
        in_force = await self._quotas.quota_of(tenant) if self._quotas is not None else override
        return admin_pb2.QuotaStatus(tenant=tenant, in_force=wire.quota_to_pb(in_force),
                                     override=wire.quota_to_pb(override))


class _ClusterView(NamedTuple):
    addresses: bool  # the nodes' addresses
    shards: bool  # the shards: owners, fencing tokens, lease expiries


def _view_of() -> _ClusterView:
    """What the caller may see of the cluster: an admin (or anyone, authentication off) all of it;
    a worker the nodes' addresses too, to follow the membership; a client or viewer neither."""
    caller = current_caller.get()
    if caller.tenant is None or caller.role is Role.ADMIN:
        return _ClusterView(addresses=True, shards=True)
    return _ClusterView(addresses=caller.role is Role.WORKER, shards=False)


def _may_see(worker: admin_pb2.WorkerStatus) -> bool:
    """Whether the caller may see ``worker``: an admin (or anyone, authentication off) sees every
    worker; a tenant's token its own tenant's workers and those that serve every tenant."""
    caller = current_caller.get()
    if caller.tenant is None or caller.role is Role.ADMIN:
        return True
    return worker.tenant in ("", caller.tenant)
