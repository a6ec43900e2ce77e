"""The ``fastlane`` command: argument parsing, dispatch to a command, and error reporting.

Expected failures never show a traceback: a remote or validation error prints ``error: …`` and
exits 1; a usage error prints argparse's usage and exits 2. A connection or access refusal (TLS,
token, role) is one line saying what went wrong and which flag to look at; for a connection the
transport's own words follow, indented.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import grpc

from fastlane.cli import cluster, completion, daemon, jobs, quotas, runs, tokens, workflows
from fastlane.cli.arguments import DURATION_SYNTAX, TOKEN_ENV, UsageError, default_server
from fastlane.errors import FastlaneError, RemoteError
from fastlane.runtime.version import installed_version

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # as a process ended by SIGPIPE: the reader of the output went away


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree. Each command stores its function as ``handler``."""
    parser = argparse.ArgumentParser(
        prog="fastlane",
        description="fastlane: a precise, durable, sharded job scheduler.",
        epilog=f"Run `fastlane COMMAND --help` for the flags of a command. A flag that takes a duration "
               f"(SECONDS, LIFETIME) takes {DURATION_SYNTAX}.",
    )
    parser.add_argument("--version", action="version", version=f"fastlane {installed_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    daemon.register(commands)
    jobs.register(commands)
    runs.register(commands)
    workflows.register(commands)
    cluster.register(commands)
    tokens.register(commands)
    quotas.register(commands)
    _register_demo(commands)
    _register_bench(commands)
    shell = commands.add_parser("completion", help="print a shell completion script (bash, zsh or fish)",
                                description=help_text(completion.__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    completion.add_arguments(shell)
    shell.set_defaults(handler=completion.run, command_parser=shell, whole_parser=build_parser)
    _describe_from_summaries(parser)
    return parser


def _describe_from_summaries(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description its one-line summary as one, so that its
    ``--help`` opens by saying what it does, as the list of commands does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for name, command in action.choices.items():
                summary = summaries.get(name)
                if not command.description and summary:
                    command.description = summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else ".")
                _describe_from_summaries(command)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :mod:`fastlane.x`, :func:`~a.b`
_LITERAL = re.compile(r"``([^`]+)``")


def help_text(docstring: str | None) -> str:
    """A module docstring as a terminal shows it: reStructuredText's markup dropped (``x`` and
    :role:`x` become x, a literal block's ``::`` becomes ``:``), its words kept."""
    text = _LITERAL.sub(r"\1", _ROLE.sub(r"\1", docstring or ""))
    return text.replace("::\n", ":\n")


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
    parser = commands.add_parser("demo", help=help_text(summary), description=help_text(demo.__doc__))
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
    parser = commands.add_parser("bench", help=help_text(summary), description=help_text(bench.__doc__))
    bench.add_arguments(parser)
    parser.set_defaults(handler=bench.run, command_parser=parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fastlane`` command line; return the process exit code."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # told by the command's own parser, with its usage, not the top level's
            (getattr(args, "command_parser", None) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
        try:
            return int(args.handler(args) or EXIT_OK)
        except UsageError as error:
            # Flags that parse but do not go together: the sentence says which, the whole usage
            # would bury it.
            prog = args.command_parser.prog
            print(f"{prog}: error: {error}\n(`{prog} --help` lists its flags)", file=sys.stderr)
            return EXIT_USAGE
    except SystemExit as exit_request:
        return _exit_code(exit_request)
    except RemoteError as error:
        return _report_remote(error, args)
    except FastlaneError as error:
        return _report(str(error))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_gone()
    return EXIT_ERROR  # not reached: error() always exits


def _reader_gone() -> int:
    """``fastlane jobs list | head``: the rest of the output has no reader, which is no error. Standard
    output is pointed at /dev/null so that the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind sys.stdout (a test's capture)
        pass
    return EXIT_BROKEN_PIPE


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


def _report_remote(error: RemoteError, args: argparse.Namespace) -> int:
    server = getattr(args, "server", None) or default_server()
    # The transport's own words (gRPC's, with its status names) only for -v and --json.
    technical = getattr(args, "json", False) or getattr(args, "verbose", False)
    if error.code is grpc.StatusCode.UNAVAILABLE:
        problem = _connection_problem(error.details, server, args)
        if problem is None:
            problem = f"cannot reach the fastlane daemon at {server} — is `fastlane serve` running?"
        print(f"error: {problem}" + (f"\n  ({error})" if technical else ""), file=sys.stderr)
        return EXIT_ERROR
    if error.code is grpc.StatusCode.RESOURCE_EXHAUSTED and (size := _TOO_LARGE.search(error.details or "")):
        return _report(f"the request is {int(size[1]):,} bytes, more than the daemon at {server} takes "
                       f"({int(size[2]):,}: its --max-payload-bytes and some room): send a smaller payload"
                       + (f" ({error.details})" if technical else ""))
    if error.code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return _report(f"the fastlane daemon at {server} did not answer in time (raise --rpc-timeout?)")
    if error.code is grpc.StatusCode.UNAUTHENTICATED:
        if not _sends_token(args):
            return _report(f"the fastlane daemon at {server} requires an API token: set {TOKEN_ENV} or pass "
                           "--token-file (an admin makes one with `fastlane tokens create`)")
        return _report(f"the fastlane daemon at {server} refused the API token: {error.details} — check "
                       f"--token-file / {TOKEN_ENV}; a revoked or expired token must be replaced")
    if error.code is grpc.StatusCode.PERMISSION_DENIED:
        return _report(f"permission denied: {error.details} — the token's role and tenant decide what it may do "
                       "(`fastlane tokens list` shows them): use a token that allows this")
    # The daemon's own sentence; its status code is for scripts (--json) and for -v.
    if getattr(args, "json", False) or getattr(args, "verbose", False):
        return _report(f"{error.details} ({error.code.name})")
    return _report(error.details or error.code.name)


# What gRPC's transport says of a message over the receiver's limit (its text is all there is).
_TOO_LARGE = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")
# What gRPC's transport says when TLS goes wrong; matched on its text, the only place it is told.
_VERIFY_FAILED = re.compile(r"CERTIFICATE_VERIFY_FAILED: ([^:]+)")
_CLOSED = ("socket closed", "connection reset", "end of tcp stream", "broken pipe")


def _connection_problem(details: str, server: str, args: argparse.Namespace) -> str | None:
    """What a failed connection says about TLS, with the flag to check; None for anything else."""
    text = details.lower()
    tls = any(getattr(args, flag, None) for flag in ("tls", "tls_ca", "tls_cert", "tls_key"))
    no_tls = f"could not establish a TLS connection to {server}"
    if "hostname verification" in text or "not in peer certificate" in text:
        host = server.rpartition(":")[0] or server
        return (f"{no_tls}: the node's certificate is not valid for {host} — connect by a name the certificate "
                "holds, or have it reissued with this one")
    if verify_failed := _VERIFY_FAILED.search(details):
        return (f"{no_tls}: the node's certificate was not accepted ({verify_failed.group(1).strip()}) — check "
                "that --tls-ca names the CA that signed it")
    if "wrong_version_number" in text:
        return f"{no_tls}: the node does not speak TLS on this port — check the port, or leave out the TLS flags"
    if tls and ("handshake" in text or "ssl_error" in text):
        return f"{no_tls}: the TLS handshake failed — check --tls-ca and the client certificate (--tls-cert, --tls-key)"
    if not any(phrase in text for phrase in _CLOSED):
        return None
    if not tls:
        return (f"the fastlane daemon at {server} closed the connection — if it serves TLS, pass --tls-ca (and "
                "--tls-cert/--tls-key when it requires client certificates)")
    if getattr(args, "tls_cert", None) is None:
        return (f"{no_tls}: the node closed the handshake — it requires a client certificate (mutual TLS): pass "
                "--tls-cert and --tls-key")
    return (f"{no_tls}: the node closed the handshake — it did not accept the client certificate: check that "
            "--tls-cert is signed by a CA the node trusts (its --tls-client-ca) and is still valid")


def _sends_token(args: argparse.Namespace) -> bool:
    return getattr(args, "token_file", None) is not None or bool(os.environ.get(TOKEN_ENV, "").strip())
