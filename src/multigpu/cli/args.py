"""The splitter of a command's own options from the arguments it passes on (a script's).

The parser class and the typed converters every command shares are ``multigpu.common.arguments``
(the built-in jobs' parsers, below the command line, use them too).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

from multigpu.common.run_target import check_module, check_script
from multigpu.diagnostics.options import BUILTIN_JOB
from multigpu.errors import UsageError


def split_own_args(
    argv: Sequence[str], actions: Iterable[argparse.Action]
) -> tuple[list[str], list[str]]:
    """Split ``argv`` into (the command's own options, the arguments it passes on), each in order.

    An option is the command's own when its name (before any ``=``) is one of ``actions``'
    option strings; its value is taken along unless it is a flag or written ``--opt=value``.
    ``--`` ends the command's options: everything after it is passed on, even ``--opt``.
    """
    takes_value = {name: action.nargs != 0 for action in actions for name in action.option_strings}
    own: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            rest.extend(argv[i + 1 :])
            break
        name = token.split("=", 1)[0]
        if token.startswith("-") and name in takes_value:
            own.append(token)
            if takes_value[name] and "=" not in token and i + 1 < len(argv):
                own.append(argv[i + 1])
                i += 1
        else:
            rest.append(token)
        i += 1
    return own, rest


def parse_with_target(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, dict[str, Any]] | None:
    """Parse ``PROG [script.py | -m module] [script args] [options]``; None after ``--help``.

    Returns the command's own options and what it runs (``target``, ``is_module``,
    ``script_args``). The command's own options may stand anywhere; the script (checked to
    exist) or ``-m``'s module (checked importable) takes the other arguments; without either,
    the built-in job (``BUILTIN_JOB``) runs.

    Raises:
        UsageError: a bad option, an option before the script that is not the command's, a
            missing script or module.
    """
    own, rest = split_own_args(argv, parser._actions)
    if "-h" in own or "--help" in own:
        parser.print_help()
        return None
    ns = parser.parse_args(own)
    if ns.module is not None:
        check_module(ns.module)
        return ns, {"target": ns.module, "is_module": True, "script_args": tuple(rest)}
    if not rest:
        return ns, {"target": BUILTIN_JOB[0], "is_module": True, "script_args": BUILTIN_JOB[1]}
    if rest[0].startswith("-"):
        prog = parser.prog
        raise UsageError(
            f"unknown option {rest[0]!r} before the script; expected "
            f"'{prog} [script.py | -m module] [args] [options]'; see '{prog} --help'"
        )
    check_script(rest[0])
    return ns, {"target": rest[0], "is_module": False, "script_args": tuple(rest[1:])}


def split_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Split ``argv`` into a command's own tokens (the script first among its positionals) and
    the script's arguments: the command's options may stand before or after the script
    (``multigpu k8s train.py --nodes 2``); the script's own arguments that share a name with one
    go after ``--``.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> _ = p.add_argument("--nodes"), p.add_argument("script")
        >>> split_argv(["t.py", "--epochs", "3", "--nodes", "2", "--", "--out", "x"], p)
        (['--nodes', '2', 't.py'], ['--epochs', '3', '--out', 'x'])
    """
    takes_value = {}
    for action in parser._actions:
        for option in action.option_strings:
            takes_value[option] = action.nargs != 0
    own: list[str] = []
    script: str | None = None
    rest: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            tail = tokens[i:]
            if script is None and tail:
                script, tail = tail[0], tail[1:]
            rest += tail
            break
        name = token.split("=", 1)[0]
        if token.startswith("-") and name in takes_value:
            own.append(token)
            if takes_value[name] and "=" not in token and i < len(tokens):
                own.append(tokens[i])
                i += 1
        elif script is None and token.startswith("-"):
            own.append(token)  # not ours, before the script: the parser names it
        elif script is None:
            script = token
        else:
            rest.append(token)
    return [*own, *([script] if script is not None else [])], rest


def parse_script_command(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, list[str]] | None:
    """Parse a command that takes a script and its arguments (``split_argv``): the namespace
    and the script's arguments, or None after printing the help (``-h`` before any ``--``)."""
    if any(a in ("-h", "--help") for a in argv[: argv.index("--") if "--" in argv else None]):
        parser.print_help()
        return None
    own, script_args = split_argv(argv, parser)
    return parser.parse_args(own), script_args
