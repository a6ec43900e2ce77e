"""``fastlane completion bash|zsh|fish``: a shell completion script, made from the command line's own parser.

The script is generated from the argparse tree, so it knows every command, subcommand and flag
of this version and never drifts from them; it completes words only (commands and flags), not
values such as job ids, which would need a node. Install it once::

    fastlane completion bash > ~/.local/share/bash-completion/completions/fastlane
    fastlane completion zsh > "${fpath[1]}/_fastlane"     # or: source <(fastlane completion zsh)
    fastlane completion fish > ~/.config/fish/completions/fastlane.fish
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

SHELLS = ("bash", "zsh", "fish")


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


def fish_script(parser: argparse.ArgumentParser) -> str:
    """fish completions for ``fastlane``: ``__fastlane_path`` finds the command typed so far (the
    same walk as the bash function's), and each command offers its subcommands and flags."""
    known, offered = [], []
    for path, subcommands, flags in commands_of(parser):
        known += [f'            case "{path}"', f"                set subs {' '.join(subcommands)}".rstrip()]
        condition = f"'__fastlane_at \"{path}\"'"
        if subcommands:
            offered.append(f"complete -c fastlane -n {condition} -a '{' '.join(subcommands)}'")
        offered += [f"complete -c fastlane -n {condition} -l {flag.removeprefix('--')}" for flag in flags]
    return "\n".join([
        "# fastlane completion for fish (made by `fastlane completion fish`)",
        "function __fastlane_path",
        "    set -l words (commandline -opc)",
        "    set -e words[1]",
        '    set -l path ""',
        "    for word in $words",
        "        set -l subs",
        '        switch "$path"',
        *known,
        "        end",
        "        if contains -- $word $subs",
        '            set path (string trim -- "$path $word")',
        "        end",
        "    end",
        '    echo "$path"',
        "end",
        "function __fastlane_at",
        "    set -l path (__fastlane_path)",
        '    test "$path" = "$argv[1]"',
        "end",
        "complete -c fastlane -f",
        *offered,
        "",
    ])


SCRIPTS = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}


def run(args: argparse.Namespace) -> int:
    """Print the script for ``args.shell``; ``args.whole_parser`` builds the command line's parser
    (set by the command's registration, which this module must not import)."""
    parser: Any = args.whole_parser()
    print(SCRIPTS[args.shell](parser), end="")
    return 0
