"""Running a command against a daemon: one client per invocation, closed before exit."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastlane.cli.arguments import client_tls
from fastlane.client import Client
from fastlane.domain.records import Page
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
