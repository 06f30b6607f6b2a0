"""The one argument-parser class and the typed converters of every command line multigpu has.

``multigpu``'s subcommands (``multigpu.cli``) and the built-in jobs' own parsers
(``multigpu.examples``, which the launcher runs before any worker starts) share them: a bad
argument is one line, ``what was given; what was expected; see 'PROG --help'``, raised as a
UsageError (exit code 2) instead of argparse's usage block, and no option is matched by a prefix.
No torch, nothing of the library above ``errors``: the launcher imports it before torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, NoReturn, TypeVar

from multigpu.common.choices import did_you_mean
from multigpu.common.profile_window import parse_window
from multigpu.errors import UsageError

T = TypeVar("T")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError (one line) instead of printing usage and exiting.

    Example:
        >>> Parser(prog="multigpu x").parse_args(["--nope"])
        Traceback (most recent call last):
        multigpu.errors.UsageError: unrecognized arguments: --nope; see 'multigpu x --help'
    """

    def __init__(self, **kwargs: Any) -> None:
        # Whole option names only: "--epoch" is not "--epochs" (argparse's prefix matching).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        if "training_script" in message:  # argparse would name torchrun's internal dest
            raise UsageError(
                f"'{self.prog}' was given no script; expected '{self.prog} [options] script.py "
                f"[args]' or '{self.prog} [options] -m module [args]'; see '{self.prog} --help'"
            )
        raise UsageError(f"{message}; see '{self.prog} --help'")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own check and words, with the closest choice named ("did you mean
        # fsdp?"): Python 3.14's suggest_on_error does the same; 3.10-3.13 have nothing.
        choices = action.choices
        if choices is None or value in choices:
            return
        names = ", ".join(map(repr, choices))
        raise argparse.ArgumentError(
            action,
            f"invalid choice: {value!r} (choose from {names})"
            f"{did_you_mean(value, map(str, choices))}",
        )

    def add_json(self, what: str = "one JSON document") -> None:
        """``--json`` (``as_json``): print ``what`` instead of the table."""
        self.add_argument("--json", dest="as_json", action="store_true", help=f"print {what}")

    def add_timeout(self, default: float, what: str) -> None:
        """``--timeout SECONDS``: a number >= 1, ``default`` when not given; ``what`` it bounds."""
        self.add_argument(
            "--timeout",
            type=number_arg(float, 1),
            default=float(default),
            metavar="SECONDS",
            help=f"{what} (default {default:g})",
        )


def _checked(
    kind: Callable[[str], T],
    accepts: Callable[[T], bool],
    wrong: Callable[[str], str],
    unreadable: Callable[[str], str] | None = None,
) -> Callable[[str], T]:
    """An argparse ``type``: ``kind(text)`` when ``accepts`` it, else the error ``wrong(text)``
    (``unreadable(text)`` when ``kind`` cannot read it, if given)."""

    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError((unreadable or wrong)(text)) from None
        if not accepts(value):
            raise argparse.ArgumentTypeError(wrong(text))
        return value

    return parse


def number_arg(kind: type[int] | type[float], low: float) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind(text)`` when it is >= ``low`` and finite, else a clear error."""
    what = "an integer" if kind is int else "a number"
    return _checked(
        kind,
        lambda value: value >= low and not math.isinf(value),
        lambda text: f"{text!r} is not valid; expected {what} >= {low:g}",
    )


def whole_arg(low: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number (digits only) >= ``low``."""
    return _checked(
        lambda text: int(text) if text.strip().isdigit() else -1,
        lambda value: value >= low,
        lambda text: f"{text!r} is not valid; expected a whole number >= {low}",
    )


processes_arg = _checked(
    int, lambda value: value >= 1, lambda text: f"{text!r} is not a number of processes >= 1"
)
"""An argparse ``type``: a whole number of processes (or nodes) >= 1."""


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind(text)`` when it is a finite number above 0."""
    return _checked(
        kind,
        lambda value: value > 0 and math.isfinite(value),
        lambda text: f"{text} must be a positive finite number",
        lambda text: f"{text!r} is not a {kind.__name__}",
    )


seconds_arg = _checked(
    float,
    lambda value: value > 0 and not math.isinf(value),
    lambda text: (
        f"--timeout {text} is not a number of seconds; expected a positive number, "
        "e.g. --timeout 120"
    ),
)
"""argparse ``type`` of ``--timeout``: a positive number of seconds."""


def cpu_count_arg(text: str) -> int | Literal["auto"]:
    """argparse ``type`` of ``--cpu``: a whole number of processes >= 1, or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"  # resolved by the plan from the measured split (launch.cpu_split)
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip():
        raise argparse.ArgumentTypeError(
            f"--cpu {text} is not a number of processes; expected a whole number >= 1 or auto; "
            "use e.g. --cpu 2 for two CPU processes"
        )
    return value


def process_counts(
    text: str, example: str = "1,2", *, what: str = "process counts", option: str = "--nproc"
) -> list[int]:
    """Parse ``--nproc N,M,...`` (or another ``option`` listing ``what``): whole numbers >= 1,
    each once, in the order given."""
    sizes: list[int] = []
    for part in text.split(","):
        size = int(part) if part.strip().isdigit() else 0
        if size < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a list of {what}; expected numbers >= 1 separated "
                f"by commas, e.g. {option} {example}"
            )
        if size not in sizes:
            sizes.append(size)
    return sizes


def options_from(namespace: argparse.Namespace, cls: type[T], **given: Any) -> T:
    """``cls`` (a dataclass) from the parsed options of the same names, and ``given``."""
    names = {f.name for f in dataclasses.fields(cls)} - given.keys()  # type: ignore[arg-type]
    return cls(**{n: getattr(namespace, n) for n in names if hasattr(namespace, n)}, **given)


def profile_arg(text: str) -> tuple[int, int]:
    """argparse ``type`` of ``--profile``: ``FIRST:LAST`` optimizer steps, counted from 1."""
    try:
        return parse_window(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
