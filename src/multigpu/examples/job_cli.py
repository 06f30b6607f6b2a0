"""What the built-in jobs' command lines share: positive numbers, and how a job ends.

A job (``multigpu.examples.digits``, ``multigpu.examples.lm``) parses its options, trains, and
ends with exit code 0, or 2 and one line on a usage error — said once, by rank 0, since every
rank refuses the same input.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import multigpu


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse ``type``: ``kind(text)`` when it is a finite number above 0.

    Example:
        >>> positive(float)("3e-3")
        0.003
    """

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text} must be a positive finite number")
        return value

    return parse


def run_job(
    parser: argparse.ArgumentParser,
    train: Callable[[argparse.Namespace], Any],
    argv: list[str] | None,
) -> int:
    """Parse ``argv`` with ``parser`` and ``train``: 0, or 2 with one line on a usage error."""
    args = parser.parse_args(argv)
    try:
        train(args)
    except multigpu.UsageError as e:
        if os.environ.get("RANK", "0") == "0":  # the same message on every rank: say it once
            print(f"multigpu train: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0
