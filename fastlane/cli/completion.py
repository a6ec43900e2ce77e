"""``fastlane completion bash|zsh``: a shell completion script, made from the command line's own parser.

The script is generated from the argparse tree, so it knows every command, subcommand and flag
of this version and never drifts from them; it completes words only (commands and flags), not
values such as job ids, which would need a node. Install it once::

    fastlane completion bash > ~/.local/share/bash-completion/completions/fastlane
    fastlane completion zsh > "${fpath[1]}/_fastlane"     # or: source <(fastlane completion zsh)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

SHELLS = ("bash", "zsh")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def commands_of(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, list[str], list[str]]]:
    """Each command path (``""``, ``"jobs"``, ``"jobs create"``…) with its subcommands and flags."""
    subcommands: dict[str, argparse.ArgumentParser] = {}
    flags: list[str] = []
    for action in parser._actions:  # argparse has no public way to walk its tree
        if isinstance(action, argparse._SubParsersAction):
            subcommands.update(action.choices)
        flags += [option for option in action.option_strings if option.startswith("--")]
    yield path, sorted(subcommands), sorted(flags)
    for name, child in sorted(subcommands.items()):
        yield from commands_of(child, f"{path} {name}".strip())


def bash_script(parser: argparse.ArgumentParser) -> str:
    """A bash completion function for ``fastlane`` (zsh runs it through ``bashcompinit``)."""
    known, offered = [], []
    for path, subcommands, flags in commands_of(parser):
        known.append(f'        "{path}") subs="{" ".join(subcommands)}" ;;')
        offered.append(f'        "{path}") words="{" ".join(subcommands + flags)}" ;;')
    return "\n".join([
        "# fastlane completion for bash (made by `fastlane completion bash`)",
        "_fastlane() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" path="" subs words i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "$path" in',
        *known,
        '        *) subs="" ;;',
        "        esac",
        '        case " $subs " in *" ${COMP_WORDS[i]} "*) path="${path:+$path }${COMP_WORDS[i]}" ;; esac',
        "    done",
        '    case "$path" in',
        *offered,
        '        *) words="" ;;',
        "    esac",
        '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "}",
        "complete -o default -F _fastlane fastlane",
        "",
    ])


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return "#compdef fastlane\nautoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser)


def run(args: argparse.Namespace) -> int:
    """Print the script for ``args.shell``; ``args.whole_parser`` builds the command line's parser
    (set by the command's registration, which this module must not import)."""
    parser: Any = args.whole_parser()
    print(bash_script(parser) if args.shell == "bash" else zsh_script(parser), end="")
    return 0
