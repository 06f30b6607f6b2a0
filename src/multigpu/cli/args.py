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
