"""The ``fastlane`` command: argument parsing, dispatch to a command, and error reporting.

Expected failures never show a traceback: a remote or validation error prints ``error: …`` and
exits 1; a usage error prints argparse's usage and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

import grpc

from fastlane.cli import cluster, daemon, jobs, runs, tokens
from fastlane.cli.arguments import UsageError, default_server
from fastlane.errors import FastlaneError
from fastlane.rpc.status import RemoteError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree. Each command stores its function as ``handler``."""
    parser = argparse.ArgumentParser(
        prog="fastlane",
        description="fastlane: a precise, durable, sharded job scheduler.",
        epilog="Run `fastlane COMMAND --help` for the flags of a command.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    daemon.register(commands)
    jobs.register(commands)
    runs.register(commands)
    cluster.register(commands)
    tokens.register(commands)
    _register_demo(commands)
    _register_bench(commands)
    return parser


def _register_demo(commands: Any) -> None:
    """``fastlane demo`` lives in its own module, present only in some builds."""
    try:
        demo = importlib.import_module("fastlane.demo")
    except ImportError:
        return
    if not (callable(getattr(demo, "add_arguments", None)) and callable(getattr(demo, "run", None))):
        return
    summary = (demo.__doc__ or "run a self-contained demonstration").strip().splitlines()[0]
    # A module docstring may open with its own command name: "``fastlane demo``: what it does".
    if summary.startswith("``") and "``: " in summary:
        summary = summary.split("``: ", 1)[1]
    parser = commands.add_parser("demo", help=summary, description=demo.__doc__)
    demo.add_arguments(parser)
    parser.set_defaults(handler=demo.run, command_parser=parser)


def _register_bench(commands: Any) -> None:
    """``fastlane bench`` drives the ``bench`` package, shipped with the source tree; its flags
    module imports nothing heavy, so registering it costs nothing."""
    try:
        bench = importlib.import_module("fastlane.cli.bench")
    except ImportError:
        return
    summary = (bench.__doc__ or "run a benchmark scenario").strip().splitlines()[0]
    if summary.startswith("``") and "``: " in summary:
        summary = summary.split("``: ", 1)[1]
    parser = commands.add_parser("bench", help=summary, description=bench.__doc__)
    bench.add_arguments(parser)
    parser.set_defaults(handler=bench.run, command_parser=parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fastlane`` command line; return the process exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        try:
            return int(args.handler(args) or EXIT_OK)
        except UsageError as error:
            args.command_parser.error(str(error))  # prints usage, raises SystemExit(2)
    except SystemExit as exit_request:
        return _exit_code(exit_request)
    except RemoteError as error:
        return _report_remote(error, getattr(args, "server", None) or default_server())
    except FastlaneError as error:
        return _report(str(error))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_ERROR  # not reached: error() always exits


def _exit_code(exit_request: SystemExit) -> int:
    code = exit_request.code
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return EXIT_ERROR


def _report(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _report_remote(error: RemoteError, server: str) -> int:
    detail = str(error)
    if error.code is grpc.StatusCode.UNAVAILABLE:
        print(
            f"error: cannot reach the fastlane daemon at {server} — is `fastlane serve` running?\n  ({detail})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if error.code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return _report(f"the fastlane daemon at {server} did not answer in time (raise --rpc-timeout?)")
    return _report(detail)
