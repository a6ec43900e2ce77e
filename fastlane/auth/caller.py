"""Who is making the current call, as the node established it, and the tenant it acts for.

The access interceptor (:mod:`fastlane.server.access`) sets :data:`current_caller` for the
duration of each call; servicers ask :func:`acting_tenant` which tenant a request may touch. With
authentication off (a development node on loopback) the caller is :data:`ANONYMOUS`, and the
tenant is whatever the request names, as before tokens existed.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from fastlane.domain import validation
from fastlane.domain.access import Role
from fastlane.domain.errors import PermissionDenied
from fastlane.domain.models import DEFAULT_TENANT

# Worker ids are qualified by the tenant of the worker's token with this separator, which a tenant
# name cannot contain: two tenants' workers never share an id, so one cannot report for another.
WORKER_TENANT_SEPARATOR = "#"


@dataclass(frozen=True, slots=True)
class Caller:
    """The identity behind a call.

    Attributes:
        token_id: The token that authenticated it; None when authentication is off.
        tenant: The token's tenant; None when authentication is off (the request names it).
    """

    token_id: str | None
    name: str
    tenant: str | None
    role: Role

    @property
    def authenticated(self) -> bool:
        return self.token_id is not None


ANONYMOUS = Caller(token_id=None, name="", tenant=None, role=Role.ADMIN)
current_caller: ContextVar[Caller] = ContextVar("fastlane_caller", default=ANONYMOUS)


def acting_tenant(requested: str, caller: Caller | None = None) -> str:
    """The tenant a request acts for: the one it names, or else the caller's own.

    Raises:
        InvalidArgument: the named tenant is not a valid name.
        PermissionDenied: the request names another tenant than the token's, and the token is not
            an admin's.
    """
    caller = caller or current_caller.get()
    if requested:
        validation.name("tenant", requested)
    if caller.tenant is None:
        return requested or DEFAULT_TENANT
    if requested and requested != caller.tenant and caller.role is not Role.ADMIN:
        raise PermissionDenied(
            f"token {caller.token_id} belongs to tenant {caller.tenant!r} and may not act for tenant {requested!r}"
        )
    return requested or caller.tenant


def worker_tenant(requested: str, caller: Caller | None = None) -> str | None:
    """The tenant whose runs a worker stream receives: None for every tenant (authentication
    off, or an admin token without ``hello.tenant``)."""
    caller = caller or current_caller.get()
    if caller.tenant is None or (caller.role is Role.ADMIN and not requested):
        return validation.name("hello.tenant", requested) if requested else None
    return acting_tenant(requested, caller)


def qualified_worker_id(worker_id: str, caller: Caller | None = None) -> str:
    """The id a worker is known by: qualified by its token's tenant (``acme#vm-1``) unless the
    token is an admin's or authentication is off."""
    caller = caller or current_caller.get()
    if caller.tenant is None or caller.role is Role.ADMIN:
        return worker_id
    return f"{caller.tenant}{WORKER_TENANT_SEPARATOR}{worker_id}"
