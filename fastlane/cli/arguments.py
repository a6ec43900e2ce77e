"""Flags shared by several commands, and turning their text into domain values.

Values whose *form* argparse can check (numbers, choices) are checked by argparse: a mistake there
is a usage error (exit 2). Values that need domain knowledge (instants, zones, cron, JSON) are
parsed here and raise :class:`~fastlane.errors.InvalidArgument` (exit 1), naming the flag.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import orjson

from fastlane.auth.tls import ClientTls
from fastlane.domain import validation
from fastlane.domain.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_HISTORY_RETENTION,
    MAX_JITTER,
    MAX_TENANT_IN_FLIGHT,
    MAX_TENANT_WEIGHT,
    MIN_HISTORY_RETENTION,
    PAYLOAD_CEILING_BYTES,
)
from fastlane.domain.models import DEFAULT_TENANT, Schedule
from fastlane.domain.schedules import parse_at, validate_schedule, zone
from fastlane.engine.dispatch.reserve import PriorityReserve
from fastlane.errors import ConfigurationError, InvalidArgument, ScheduleError
from fastlane.rpc.channel import DEFAULT_PORT, DEFAULT_SERVER

SERVER_ENV = "FASTLANE_SERVER"
TOKEN_ENV = "FASTLANE_TOKEN"  # read by fastlane.rpc.channel.load_token


class UsageError(Exception):
    """A combination of flags that makes no sense; reported like an argparse error (exit 2)."""


def default_server() -> str:
    """The daemon address used when ``--server`` is not given: the first of $FASTLANE_SERVER, else
    the default (argparse passes it through :func:`server_address` too)."""
    return next(iter(_listed_servers()), DEFAULT_SERVER)


def servers_from_env() -> list[str]:
    """Every node $FASTLANE_SERVER names (``HOST:PORT``, several separated by commas), for
    ``fastlane worker``; empty when it is not set.

    Raises:
        ConfigurationError: an address in it is not ``HOST:PORT``, naming the variable.
    """
    try:
        return [server_address(address) for address in _listed_servers()]
    except argparse.ArgumentTypeError as error:
        raise ConfigurationError(f"${SERVER_ENV}: {error}") from None


def _listed_servers() -> list[str]:
    return [address.strip() for address in os.environ.get(SERVER_ENV, "").split(",") if address.strip()]


_GRPC_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")


def server_address(text: str) -> str:
    """A daemon's ``HOST:PORT``; a bare host (``localhost``, ``10.0.0.7``, ``::1``) gets the default
    port, 7070, not gRPC's own default of 443. gRPC's other targets (``dns:///…``, ``ipv4:…``,
    ``unix:…``) pass as given."""
    text = text.strip()
    if "://" in text or text.startswith(_GRPC_SCHEMES):
        return text
    if text.startswith("["):  # [IPv6] or [IPv6]:PORT
        host, _, rest = text.partition("]")
        host += "]"
    elif text.count(":") > 1:  # a bare IPv6 address
        host, rest = f"[{text}]", ""
    else:
        host, colon, port = text.partition(":")
        rest = colon + port
    if not rest:
        return f"{host}:{DEFAULT_PORT}"
    if not rest.startswith(":") or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (a port is 1..65535)")
    return text


# -- argparse value types --------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def tenant_number(what: str, highest: int) -> Callable[[str], tuple[str, int]]:
    """A parser of ``TENANT=N``: a tenant name and its ``what`` (e.g. weight), 1..``highest``."""
    def parse(text: str) -> tuple[str, int]:
        tenant, equals, number = text.partition("=")
        if not equals:
            raise argparse.ArgumentTypeError(f"{text!r} is not TENANT=N, e.g. billing=3")
        try:
            validation.name("tenant", tenant)
        except InvalidArgument as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        value = positive_int(number)
        if value > highest:
            raise argparse.ArgumentTypeError(f"{what} {value} is out of range (1..{highest})")
        return tenant, value
    return parse


tenant_weight = tenant_number("weight", MAX_TENANT_WEIGHT)
tenant_max_in_flight = tenant_number("cap", MAX_TENANT_IN_FLIGHT)


def priority_reserve(text: str) -> PriorityReserve:
    """``PRIORITY=N``: keep N credits of every worker stream for runs of priority PRIORITY or more."""
    priority, equals, number = text.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"{text!r} is not PRIORITY=N, e.g. 100=3")
    try:
        reserve = PriorityReserve(int(priority), positive_int(number))
    except ValueError:
        raise argparse.ArgumentTypeError(f"priority {priority!r} is not a whole number") from None
    try:
        reserve.validate()
    except ConfigurationError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--priority-reserve ")) from None
    return reserve


# Every duration a command takes is written one way: seconds, or a number with one of these units.
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
DURATION_SYNTAX = "a number of seconds, or numbers with units: 500ms, 90s, 15m, 2h, 1d, 1h30m"
MAX_DURATION_S = 100 * 365 * 86_400.0  # a century: beyond any bound the API takes, within what a timedelta holds


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")


def duration_seconds(text: str, bare_unit: float = 1.0) -> float:
    """``text`` as seconds: ``90`` (a bare number, in ``bare_unit`` seconds: seconds unless a flag
    says otherwise) or ``90s``, ``1.5m``, ``2h``, ``1d``, ``250ms``, and sums of them: ``1h30m``.

    Raises:
        ValueError: not a finite number, nor numbers with known units.
    """
    body = text.strip().lower()
    try:
        value = float(body) * bare_unit
    except ValueError:
        parts = _DURATION_PART.findall(body)
        if not parts or "".join(number + unit for number, unit in parts) != body.lstrip("+"):
            raise ValueError(text) from None
        value = sum(float(number) * DURATION_UNITS[unit] for number, unit in parts)
    if not abs(value) <= MAX_DURATION_S:  # NaN and infinities fail here too
        raise ValueError(text)
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a positive duration (:func:`duration_seconds`), in seconds."""
    try:
        value = duration_seconds(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: {DURATION_SYNTAX}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive duration")
    return value


def jitter_seconds(text: str) -> float:
    """An argparse type: a schedule's jitter (:func:`duration_seconds`), 0 for none."""
    try:
        value = duration_seconds(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: {DURATION_SYNTAX}") from None
    if not 0 <= value <= MAX_JITTER.total_seconds():
        raise argparse.ArgumentTypeError(f"{text} is out of range: 0 (none) to 24h")
    return value


def history_retention_days(text: str) -> float:
    """An argparse type: days of history to keep (a bare number is days; with a unit, a duration
    as everywhere: ``36h``, ``30d``), 0 (for ever) or within the retention bounds."""
    try:
        days = duration_seconds(text, bare_unit=86_400.0) / 86_400.0
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days nor a duration ({DURATION_SYNTAX})") from None
    low, high = MIN_HISTORY_RETENTION / timedelta(days=1), MAX_HISTORY_RETENTION / timedelta(days=1)
    if days != 0 and not low <= days <= high:  # NaN and infinities fail here too
        raise argparse.ArgumentTypeError(f"{text} is out of range ({low:.3g}..{high:g} days, or 0 to keep all)")
    return days


def whole_number_up_to(maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``1..maximum``."""

    def whole_number(text: str) -> int:
        value = positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{value} is out of range (1..{maximum})")
        return value

    return whole_number


def whole_number_from_0_up_to(maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``0..maximum``."""

    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not 0 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{value} is out of range (0..{maximum})")
        return value

    return whole_number


def seconds_up_to(maximum: float) -> Callable[[str], float]:
    """An argparse type: a duration (:func:`duration_seconds`) in ``0..maximum`` seconds."""

    def seconds(text: str) -> float:
        try:
            value = duration_seconds(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration: {DURATION_SYNTAX}") from None
        if not 0 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{text} is out of range (0..{maximum:g} s)")
        return value

    return seconds


def _milliseconds(text: str) -> float:
    """A duration as milliseconds: a bare number is milliseconds, one with a unit (``0.3s``,
    ``250ms``) is read as everywhere."""
    try:
        return duration_seconds(text, bare_unit=0.001) * 1000
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds nor a duration "
                                         f"({DURATION_SYNTAX})") from None


def milliseconds_up_to(maximum: float) -> Callable[[str], float]:
    """An argparse type: a duration in ``0..maximum`` milliseconds (:func:`_milliseconds`)."""

    def milliseconds(text: str) -> float:
        value = _milliseconds(text)
        if not 0 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{text} is out of range (0..{maximum:g} ms)")
        return value

    return milliseconds


def positive_milliseconds(text: str) -> float:
    """An argparse type: a positive duration as milliseconds (:func:`_milliseconds`)."""
    value = _milliseconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive duration")
    return value


# -- shared flag groups ------------------------------------------------------------------------


def client_flags(*, tenant: bool = True) -> argparse.ArgumentParser:
    """A parent parser with the flags of every command that talks to a daemon (``tenant=False``
    for a command whose own ``--tenant`` means something else)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("daemon connection")
    group.add_argument(
        "--server",
        metavar="HOST:PORT",
        type=server_address,
        default=default_server(),
        help=f"address of a fastlane daemon; a host alone means port {DEFAULT_PORT} (default: ${SERVER_ENV}, "
        f"else {DEFAULT_SERVER})",
    )
    if tenant:
        group.add_argument(
            "--tenant", default="",
            help=f"tenant to act for (default: the token's; without authentication: {DEFAULT_TENANT}); another "
            "tenant than the token's needs an admin token",
        )
    group.add_argument(
        "--rpc-timeout",
        metavar="SECONDS",
        type=positive_seconds,
        default=10.0,
        help="give up on the daemon after this many seconds (default: 10)",
    )
    group.add_argument("-v", "--verbose", action="store_true",
                       help="with an error the daemon sent, also show its gRPC status code (as --json does)")
    security_flags(group)
    return parent


def security_flags(group: argparse._ActionsContainer) -> None:
    """Token and TLS flags, shared by the client commands and ``fastlane worker``."""
    group.add_argument(
        "--token-file", metavar="FILE", type=Path,
        help=f"read the API token from this file (default: ${TOKEN_ENV}, if set)",
    )
    group.add_argument("--tls", action="store_true",
                       help="connect over TLS, trusting the system's CAs (implied by --tls-ca, --tls-cert)")
    group.add_argument("--tls-ca", metavar="FILE", type=Path, help="connect over TLS, trusting this PEM CA")
    group.add_argument("--tls-cert", metavar="FILE", type=Path,
                       help="present this PEM client certificate (mutual TLS); needs --tls-key")
    group.add_argument("--tls-key", metavar="FILE", type=Path, help="the PEM private key of --tls-cert")


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """The TLS settings the flags ask for, or None for a plain connection."""
    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_key):
        return None
    return ClientTls(ca_file=args.tls_ca, cert_file=args.tls_cert, key_file=args.tls_key)


def count_or_unlimited(text: str) -> int | None:
    """A quota count: a whole number from 0, or ``unlimited`` (None)."""
    if text.strip().lower() == "unlimited":
        return None
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number from 0, or 'unlimited'")
    return int(text)


def rate_or_unlimited(text: str) -> float | None:
    """A quota rate: a number from 0, or ``unlimited`` (None)."""
    if text.strip().lower() == "unlimited":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number from 0, or 'unlimited'")
    return value


def lifetime(text: str) -> timedelta:
    """A token lifetime: a duration (:func:`duration_seconds`) of at least a second: ``90m``, ``12h``, ``30d``."""
    try:
        seconds = duration_seconds(text)
    except ValueError:
        seconds = 0.0
    if not seconds >= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration of a second or more ({DURATION_SYNTAX})")
    return timedelta(seconds=seconds)


def json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of text")


def add_schedule_flags(parser: argparse.ArgumentParser, *, allow_now: bool, tz_help: str, anchor_default: str,
                       required: bool = True) -> None:
    """``--now | --at | --cron [--tz] | --every [--anchor]``: exactly one kind (at most one if not ``required``)."""
    title = "schedule (exactly one)" if required else "schedule (at most one: replaces the job's)"
    kinds = parser.add_argument_group(title).add_mutually_exclusive_group(required=required)
    if allow_now:
        kinds.add_argument("--now", action="store_true", help="fire once, as soon as possible")
    kinds.add_argument("--at", metavar="RFC3339", help="fire once at this instant, e.g. 2027-03-14T07:00:00Z")
    kinds.add_argument(
        "--cron",
        metavar="EXPR",
        help='cron expression: 5 fields, 6 with seconds first, or @daily etc., e.g. "30 2 * * *"',
    )
    kinds.add_argument(
        "--every", metavar="SECONDS", type=positive_seconds,
        help="fire repeatedly, this long apart: seconds, or with a unit (90s, 15m, 2h, 1d)"
    )
    parser.add_argument("--tz", metavar="ZONE", help=tz_help)
    parser.add_argument(
        "--anchor",
        metavar="RFC3339",
        help=f"with --every: the instant the interval counts from (default: {anchor_default})",
    )
    parser.add_argument(
        "--jitter", metavar="DURATION", type=jitter_seconds,
        help="with --cron or --every: start each run up to this long after its fire time (e.g. 5m, at most "
             "24h; 0: on the fire time), by an offset fixed per job and fire time, so jobs on one schedule do "
             "not all start at once",
    )


def schedule_from_flags(args: argparse.Namespace, *, tz_is_display_only: bool = False) -> Schedule:
    """The schedule the flags describe, validated.

    Args:
        args: Parsed flags from :func:`add_schedule_flags`.
        tz_is_display_only: ``--tz`` may go with any kind because it only chooses the zone in
            which times are shown (preview); otherwise it belongs to ``--cron`` alone.
    """
    if args.anchor is not None and args.every is None:
        raise UsageError("--anchor only goes with --every")
    if getattr(args, "jitter", None) and args.cron is None and args.every is None:
        raise UsageError("--jitter only goes with --cron or --every (a one-shot job has one fire time to keep)")
    if args.tz is not None and args.cron is None and not tz_is_display_only:
        raise UsageError("--tz only goes with --cron (fire times of --at and --every do not depend on a zone)")
    if args.tz is not None:
        zone(args.tz)  # names the zone in the error, before anything else is looked at
    if getattr(args, "now", False):
        schedule = Schedule.now()
    elif args.at is not None:
        schedule = Schedule.at_instant(instant_flag(args.at, "--at"))
    elif args.cron is not None:
        schedule = Schedule.cron_expr(args.cron, args.tz or "UTC")
    else:
        anchor = instant_flag(args.anchor, "--anchor") if args.anchor is not None else None
        schedule = Schedule.interval(timedelta(seconds=args.every), anchor)
    if getattr(args, "jitter", None):
        schedule = replace(schedule, jitter=timedelta(seconds=args.jitter))
    validate_schedule(schedule)
    return schedule


def instant_flag(text: str, flag: str) -> datetime:
    """An RFC 3339 instant given to ``flag``, as aware UTC."""
    try:
        return parse_at(text)
    except ScheduleError as error:
        raise InvalidArgument(flag, error.problem) from None


STDIN = "-"  # a payload or input read from standard input


def json_document(value: str | None, path: str | None, *, flag: str, file_flag: str) -> bytes | None:
    """The bytes of a JSON document given as text (``flag``; ``-``: standard input) or as a file
    (``file_flag``; ``-`` too), once they are known to be valid JSON; None when neither was given.

    A file or standard input is read up to :data:`PAYLOAD_CEILING_BYTES`, the most any node takes,
    so a large payload needs no room on the command line (which ends around 128 KiB).

    Raises:
        InvalidArgument: unreadable, larger than the ceiling, or not JSON, naming the flag.
    """
    if value is None and path is None:
        return None
    named = file_flag if path is not None else flag
    if path is not None or value == STDIN:
        data = _read_bounded(path if path is not None else STDIN, named)
    else:
        assert value is not None
        data = value.encode()
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise InvalidArgument(named, f'is not valid JSON ({error}); e.g. {flag} \'{{"to": "a@b.c"}}\'') from None
    return data


def _read_bounded(path: str, flag: str) -> bytes:
    try:
        if path == STDIN:
            stream = getattr(sys.stdin, "buffer", None)
            data = stream.read(PAYLOAD_CEILING_BYTES + 1) if stream is not None else sys.stdin.read().encode()
        else:
            with open(path, "rb") as source:
                data = source.read(PAYLOAD_CEILING_BYTES + 1)
    except OSError as error:
        raise InvalidArgument(flag, f"cannot be read: {error.strerror or error} ({path})") from None
    if len(data) > PAYLOAD_CEILING_BYTES:
        raise InvalidArgument(flag, f"is larger than {PAYLOAD_CEILING_BYTES >> 20} MiB, more than any node takes")
    return data


def add_json_flags(parser: argparse._ActionsContainer, flag: str, what: str, example: str) -> None:
    """``flag`` (JSON text, or ``-`` for standard input) and ``flag-file`` (a file), one or the other."""
    either = parser.add_mutually_exclusive_group()
    either.add_argument(flag, metavar="JSON", help=f"{what}, as JSON, e.g. '{example}'; '-' reads it from standard input")
    either.add_argument(f"{flag}-file", metavar="FILE",
                        help=f"{what}, read from a JSON file ('-': standard input): for a document too large "
                             f"for a command line; a node takes {DEFAULT_MAX_PAYLOAD_BYTES >> 20} MiB by default "
                             f"(serve --max-payload-bytes, at most {PAYLOAD_CEILING_BYTES >> 20} MiB)")
