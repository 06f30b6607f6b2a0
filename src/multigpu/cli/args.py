"""The pieces every subcommand's parser shares: one parser class, one set of typed converters, one
splitter of a command's own options from the arguments it passes on.

A bad argument is one line, ``what was given; what was expected; see 'PROG --help'``, raised as
a UsageError (``multigpu`` prints it and exits with 2) instead of argparse's usage and exit.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable, Sequence
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError (one line) instead of printing usage and exiting.

    Example:
        >>> Parser(prog="multigpu x").parse_args(["--nope"])
        Traceback (most recent call last):
        multigpu.errors.UsageError: unrecognized arguments: --nope; see 'multigpu x --help'
    """

    def error(self, message: str) -> NoReturn:
        from multigpu.errors import UsageError

        if "training_script" in message:  # argparse would name torchrun's internal dest
            raise UsageError(
                f"'{self.prog}' was given no script; expected '{self.prog} [options] script.py "
                f"[args]' or '{self.prog} [options] -m module [args]'; see '{self.prog} --help'"
            )
        raise UsageError(f"{message}; see '{self.prog} --help'")


def number_arg(kind: type[int] | type[float], low: float) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind(text)`` when it is >= ``low`` (and finite), else a clear error.

    Example:
        >>> number_arg(int, 1)("3")
        3
    """
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not value >= low or math.isinf(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not valid; expected {what} >= {low:g}")
        return value

    return parse


def whole_arg(low: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number (digits only) >= ``low``.

    Example:
        >>> whole_arg(1)("5")
        5
    """

    def parse(text: str) -> int:
        value = int(text) if text.strip().isdigit() else -1
        if value < low:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not valid; expected a whole number >= {low}"
            )
        return value

    return parse


def processes_arg(text: str) -> int:
    """An argparse ``type``: a whole number of processes (or nodes) >= 1.

    Example:
        >>> processes_arg("2")
        2
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes >= 1")
    return value


def split_own_args(
    argv: Sequence[str], actions: Iterable[argparse.Action]
) -> tuple[list[str], list[str]]:
    """Split ``argv`` into (the command's own options, the arguments it passes on), each in order.

    An option is the command's own when its name (before any ``=``) is one of ``actions``'
    option strings; its value is taken along unless it is a flag or written ``--opt=value``.
    ``--`` ends the command's options: everything after it is passed on, even ``--opt``.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> _ = p.add_argument("--cpu")
        >>> split_own_args(["--cpu", "2", "--epochs", "3", "--", "--cpu"], p._actions)
        (['--cpu', '2'], ['--epochs', '3', '--cpu'])
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
