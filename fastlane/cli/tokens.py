"""``fastlane tokens``: create, list and revoke API tokens.

Through a node (an admin token), or with ``--db URL`` straight against the database: that is how
the first admin token is made, before any node runs or while every node requires a token. The
secret is printed once; the database keeps only its hash.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastlane.auth.issuing import issue_token
from fastlane.cli.arguments import client_flags, json_flag, lifetime
from fastlane.cli.output import print_json, print_table
from fastlane.cli.remote import run_remote
from fastlane.client import Client
from fastlane.domain import validation
from fastlane.domain.access import ApiToken, Role
from fastlane.rpc.wire import rfc3339
from fastlane.storage import Store, open_store

T = TypeVar("T")


def register(commands: Any) -> None:
    """Add ``tokens`` and its subcommands to the top-level subparsers."""
    tokens = commands.add_parser(
        "tokens", help="create, list and revoke API tokens",
        description="Create, list and revoke API tokens. Through a node with an admin token, or with --db "
        "directly against the database (the first admin token).",
    )
    verbs = tokens.add_subparsers(dest="verb", required=True, metavar="VERB")
    remote = client_flags(tenant=False)

    create = verbs.add_parser("create", parents=[remote], help="create a token and print its secret once")
    create.add_argument("--tenant", required=True, help="the tenant the token acts for")
    create.add_argument("--role", required=True, choices=[role.value for role in Role],
                        help="admin: everything, every tenant; client: the tenant's jobs and runs; worker: run the "
                        "tenant's runs; viewer: read only")
    create.add_argument("--name", default="", help="what the token is for, shown by `tokens list` (default: none)")
    create.add_argument("--expires", metavar="LIFETIME", type=lifetime,
                        help="expire after this long: 90m, 12h, 30d (default: never)")
    _db_flag(create)
    json_flag(create)
    create.set_defaults(handler=create_token, command_parser=create)

    listing = verbs.add_parser("list", parents=[remote], help="list tokens (never their secrets)")
    listing.add_argument("--tenant", default="", help="only this tenant's tokens (default: every tenant)")
    _db_flag(listing)
    json_flag(listing)
    listing.set_defaults(handler=list_tokens, command_parser=listing)

    revoke = verbs.add_parser("revoke", parents=[remote], help="revoke a token: every node refuses it within seconds")
    revoke.add_argument("token_id", metavar="ID", help="the token's id (the part after fl_, as `tokens list` shows)")
    _db_flag(revoke)
    json_flag(revoke)
    revoke.set_defaults(handler=revoke_token, command_parser=revoke)


def _db_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="URL",
                        help="act on this database directly instead of through a node (migrating it first when "
                        "creating); e.g. sqlite:///fastlane.db or postgresql://user@host/db")


def create_token(args: argparse.Namespace) -> int:
    role = Role(args.role)
    validation.name("--tenant", args.tenant)

    async def through_store(store: Store) -> tuple[ApiToken, str]:
        await store.migrate()
        token, secret = await issue_token(store, tenant=args.tenant, role=role, name=args.name, expires_in=args.expires)
        return token, str(secret)

    async def through_node(client: Client) -> tuple[ApiToken, str]:
        return await client.create_token(args.tenant, role, name=args.name, expires_in=args.expires)

    token, secret = _run(args, through_store, through_node)
    if args.json:
        print_json({**_token_view(token), "secret": secret})
        return 0
    expiry = f", expires {rfc3339(token.expires_at)}" if token.expires_at else ""
    print(f"created token {token.token_id} (tenant {token.tenant}, role {token.role}{expiry}); its secret, "
          "shown only now:")
    print(secret)
    return 0


def list_tokens(args: argparse.Namespace) -> int:
    tenant = validation.name("--tenant", args.tenant) if args.tenant else None

    async def through_store(store: Store) -> list[ApiToken]:
        return await store.tokens.list_tokens(tenant)

    async def through_node(client: Client) -> list[ApiToken]:
        return await client.list_tokens(tenant or "")

    tokens = _run(args, through_store, through_node)
    if args.json:
        print_json([_token_view(token) for token in tokens])
        return 0
    print_table(
        ("ID", "TENANT", "ROLE", "NAME", "CREATED", "EXPIRES", "REVOKED", "LAST_USED"),
        [(t.token_id, t.tenant, t.role.value, t.name, rfc3339(t.created_at), rfc3339(t.expires_at) or "never",
          rfc3339(t.revoked_at) or "-", rfc3339(t.last_used_at) or "-") for t in tokens],
    )
    return 0


def revoke_token(args: argparse.Namespace) -> int:
    token_id = validation.identifier("ID", args.token_id)

    async def through_store(store: Store) -> ApiToken:
        return await store.tokens.revoke_token(token_id)

    async def through_node(client: Client) -> ApiToken:
        return await client.revoke_token(token_id)

    token = _run(args, through_store, through_node)
    if args.json:
        print_json(_token_view(token))
    else:
        print(f"revoked token {token.token_id} (tenant {token.tenant}, role {token.role}) at "
              f"{rfc3339(token.revoked_at)}")
    return 0


def _run(args: argparse.Namespace, through_store: Callable[[Store], Awaitable[T]],
         through_node: Callable[[Client], Awaitable[T]]) -> T:
    """Run the store version with ``--db``, else the node version with a client."""
    if args.db is None:
        result: list[T] = []

        async def remote(client: Client) -> int:
            result.append(await through_node(client))
            return 0

        run_remote(args, remote)
        return result[0]

    async def direct() -> T:
        store = open_store(args.db)
        try:
            return await through_store(store)
        finally:
            await store.close()

    return asyncio.run(direct())


def _token_view(token: ApiToken) -> dict[str, Any]:
    return {"token_id": token.token_id, "tenant": token.tenant, "role": token.role.value, "name": token.name,
            "created_at": rfc3339(token.created_at), "expires_at": rfc3339(token.expires_at),
            "revoked_at": rfc3339(token.revoked_at), "last_used_at": rfc3339(token.last_used_at)}
