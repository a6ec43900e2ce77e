"""A bulk action on the command line (``runs cancel``, ``jobs pause`` … over a selection).

It counts first: without ``--yes`` it says how many items it would take and changes nothing
(exit 1, so a script that forgot the flag does not read success); with ``--yes`` it calls the node
until the selection is done, a bounded number of items per call, and says how far it has got after
each. What is selected, and how, is the caller's: this module only drives the calls.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastlane.cli.arguments import positive_int
from fastlane.cli.output import note, print_json
from fastlane.domain.records import BulkOutcome

MAX_CALL_LIMIT = 1_000  # items a call takes when --limit is near (the node's own default otherwise)

# One call of the bulk RPC: (dry_run, limit, page_token) -> what it did.
Call = Callable[[bool, int, str], Awaitable[BulkOutcome]]


@dataclass(frozen=True, slots=True)
class Words:
    """How a bulk action speaks of itself: ``Words("runs", "cancel", "cancelled", "cancel")``."""

    items: str  # what it acts on, plural
    verb: str  # the imperative, for "add --yes to … them"
    done: str  # the participle, for "12 runs cancelled"
    action: str  # the action's value in --json output


def add_action_flags(parser: argparse.ArgumentParser, words: Words) -> None:
    """``--dry-run``, ``--yes`` and ``--limit``: the flags of a bulk action over a selection."""
    parser.add_argument("--dry-run", action="store_true",
                        help=f"with a selection: count the {words.items} it would {words.verb}, change nothing")
    parser.add_argument("--yes", action="store_true",
                        help=f"with a selection: {words.verb} them (without it, the count is shown and nothing changes)")
    parser.add_argument("--limit", metavar="N", type=positive_int,
                        help=f"with a selection: stop after this many {words.items} (default: all of the selection)")


async def act_in_calls(call: Call, words: Words, args: argparse.Namespace) -> int:
    """Count, or (with ``--yes``) act call after call; prints the outcome and returns the exit status."""
    if args.dry_run or not args.yes:
        counted = await call(True, 0, "")
        if args.json:
            print_json({"action": words.action, "dry_run": True, "matched": counted.matched})
        else:
            print(f"{counted.matched:,} {words.items} would be {words.done}")
        if not args.dry_run and counted.matched:
            note(f"nothing changed: add --yes to {words.verb} them")
            return 1
        return 0
    total, token = BulkOutcome(matched=0), ""
    while True:
        left = None if args.limit is None else args.limit - total.matched
        outcome = await call(False, 0 if left is None else min(left, MAX_CALL_LIMIT), token)
        total, token = _add(total, outcome), outcome.next_page_token
        if not token or outcome.stopped_because or (args.limit is not None and total.matched >= args.limit):
            return _report(words, total, args)
        if not args.json:
            note(f"{total.acted:,} {words.items} {words.done} so far ({total.skipped:,} skipped)…")


def _add(total: BulkOutcome, outcome: BulkOutcome) -> BulkOutcome:
    return BulkOutcome(matched=total.matched + outcome.matched, acted=total.acted + outcome.acted,
                       skipped=total.skipped + outcome.skipped, next_page_token=outcome.next_page_token,
                       stopped_because=outcome.stopped_because)


def _report(words: Words, total: BulkOutcome, args: argparse.Namespace) -> int:
    stopped = total.stopped_because
    if args.json:
        document: dict[str, Any] = {"action": words.action, "dry_run": False, "matched": total.matched,
                                    "acted": total.acted, "skipped": total.skipped, "stopped_because": stopped or None}
        print_json(document)
    else:
        skipped = f" ({total.skipped:,} skipped: they had changed meanwhile)" if total.skipped else ""
        print(f"{total.acted:,} {words.items} {words.done}{skipped}")
        if stopped:
            note(f"stopped before the end of the selection: {stopped}; run the command again to go on")
    return 1 if stopped else 0
