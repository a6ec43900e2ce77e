"""Running a command against a daemon: one client per invocation, closed before exit."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastlane.cli.arguments import client_tls
from fastlane.client import Client
from fastlane.domain.records import Page
from fastlane.errors import FastlaneError
from fastlane.rpc.channel import load_token

T = TypeVar("T")

# The daemon's ceiling for one page (see ListJobsRequest and ListRunsRequest).
MAX_PAGE_SIZE = 1000


def open_client(args: argparse.Namespace) -> Client:
    """A client configured from the common flags (``--server``, ``--tenant``, ``--rpc-timeout``,
    the token and TLS flags)."""
    return Client(args.server, tenant=getattr(args, "tenant", ""), timeout=args.rpc_timeout,
                  token=load_token(args.token_file), tls=client_tls(args))


def run_remote(args: argparse.Namespace, command: Callable[[Client], Awaitable[int]]) -> int:
    """Open a client, run ``command`` with it, and return its exit code.

    Errors propagate to :func:`fastlane.cli.main.main`, which turns them into messages.
    """

    async def with_client() -> int:
        async with open_client(args) as client:
            return await command(client)

    return asyncio.run(with_client())


async def collect_pages(fetch: Callable[[int, str], Awaitable[Page[T]]], limit: int) -> tuple[list[T], bool]:
    """Up to ``limit`` items from a paged listing, and whether more were left behind.

    Args:
        fetch: Returns the page of at most the given size that starts at the given token.
        limit: How many items to collect at most.
    """
    items: list[T] = []
    page_token = ""
    while len(items) < limit:
        page = await fetch(min(limit - len(items), MAX_PAGE_SIZE), page_token)
        items.extend(page.items)
        page_token = page.next_page_token
        if not page_token:
            break
    return items[:limit], bool(page_token)


MIN_ID_PREFIX = 4  # shorter prefixes would match too many ids to be worth a look-up


async def by_id_prefix(
    reference: str, kind: str, listed: Callable[[str], Awaitable[Page[T]]], id_of: Callable[[T], str], hint: str,
) -> str:
    """The one id that starts with ``reference`` (``listed(prefix)`` asks the node for up to two);
    FastlaneError naming what was looked for when there is none, or more than one."""
    if len(reference) >= MIN_ID_PREFIX:
        found = [id_of(item) for item in (await listed(reference)).items]
        if len(found) == 1:
            return found[0]
        if found:
            raise FastlaneError(f"more than one {kind} id starts with {reference!r}: give more of it")
    raise FastlaneError(f"no {kind} with the id{' or name' if kind == 'job' else ''} {reference!r} in this tenant "
                        f"(nor one whose id starts so; {hint})")
