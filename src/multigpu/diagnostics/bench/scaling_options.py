"""The command line of ``multigpu bench scaling``: its options, taken out of the script's arguments.

``multigpu bench scaling [script.py | -m module] [script args] [--nproc 1,2] [--steps K] ...``:
as with ``multigpu verify``, bench's own options are recognised by name anywhere on the line;
everything else is the script and its arguments; after ``--`` everything goes to the script.
Without a script: the built-in digits job (``multigpu train``'s).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from multigpu.diagnostics.options import BUILTIN_JOB, split_verify_args
from multigpu.errors import UsageError

PROG = "multigpu bench scaling"


@dataclass(frozen=True, kw_only=True)
class ScalingOptions:
    """What ``multigpu bench scaling`` was asked to measure."""

    target: str
    """The script's path, or the module with ``is_module``."""
    is_module: bool
    """``target`` is a module (``-m``)."""
    script_args: tuple[str, ...] = ()
    """Arguments passed to the script unchanged."""
    nproc: tuple[int, ...] = (1, 2)
    """World sizes, ascending; the first is the baseline of the speed-up."""
    steps: int = 50
    """Timed optimizer steps per run."""
    warmup: int = 5
    """Optimizer steps before them, not timed (start-up, first allocations)."""
    repeats: int = 1
    """Runs per configuration, interleaved; the median is reported."""
    as_json: bool = False
    """Print one JSON document instead of the tables."""
    out: Path | None = None
    """Directory for scaling.json, scaling.csv and scaling.png (None: write nothing)."""
    cpu: bool = False
    """CPU processes even on a machine with GPUs."""
    splits: bool = True
    """On CPUs, also measure every processes x threads split of the cores and save the best."""
    timeout: float = 600.0
    """Seconds one run may take."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see '{PROG} --help'")


def _nproc(text: str) -> tuple[int, ...]:
    sizes: set[int] = set()
    for part in text.split(","):
        size = int(part) if part.strip().isdigit() else 0
        if size < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a list of process counts; expected numbers >= 1 separated "
                "by commas, e.g. --nproc 1,2,4"
            )
        sizes.add(size)
    return tuple(sorted(sizes))


def _whole(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text) if text.strip().isdigit() else -1
        if value < low:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not valid; expected a whole number >= {low}"
            )
        return value

    return parse


def build_scaling_parser() -> argparse.ArgumentParser:
    """The parser of bench scaling's own options (the script and its arguments are split off)."""
    p = _Parser(
        prog=PROG,
        usage=f"{PROG} [script.py | -m module] [script args] [options]",
        allow_abbrev=False,
        description="Run a training script (default: the built-in digits job) for --steps "
        "optimizer steps at each world size of --nproc and report samples/s, speed-up and "
        "scaling efficiency (speed-up / world size). Strong scaling: the global batch (the "
        "script's ctx.loader batch_size) stays fixed, N processes share it. On CPUs each "
        "process gets 1 thread here, and every split of the cores into processes x threads is "
        "measured too; the fastest is saved for `multigpu run --cpu auto`. The script must "
        "call multigpu.init(), pass its optimizer to ctx.setup and use ctx.loader.",
    )
    p.add_argument("-m", dest="module", metavar="MODULE", help="benchmark a module (python -m)")
    p.add_argument(
        "--nproc",
        type=_nproc,
        default=(1, 2),
        metavar="N,M,...",
        help="world sizes (default 1,2); the smallest is the speed-up's baseline",
    )
    p.add_argument("--steps", type=_whole(1), default=50, help="timed optimizer steps (50)")
    p.add_argument("--warmup", type=_whole(1), default=5, help="untimed steps before them (5)")
    p.add_argument(
        "--repeats",
        type=_whole(1),
        default=1,
        help="runs per configuration, interleaved; medians reported (1)",
    )
    p.add_argument("--json", dest="as_json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write scaling.json, scaling.csv and scaling.png (matplotlib) here",
    )
    p.add_argument("--cpu", action="store_true", help="CPU processes (gloo) even with GPUs")
    p.add_argument(
        "--no-splits",
        dest="splits",
        action="store_false",
        help="on CPUs, skip the processes x threads splits (and the saved choice)",
    )
    p.add_argument("--timeout", type=_whole(1), default=600, help="seconds one run may take (600)")
    return p


def parse_scaling_args(argv: Sequence[str]) -> ScalingOptions | None:
    """Parse ``multigpu bench scaling``'s command line; None after printing ``--help``.

    Raises:
        UsageError: a bad option, a missing script or module (exit code 2).

    Example:
        >>> parse_scaling_args(["--nproc", "2,1", "--steps", "5"]).nproc
        (1, 2)
    """
    parser = build_scaling_parser()
    own, rest = split_verify_args(argv, parser)
    if "-h" in own or "--help" in own:
        parser.print_help()
        return None
    ns = parser.parse_args(own)
    if ns.module is not None:
        target, is_module, args = ns.module, True, tuple(rest)
        if importlib.util.find_spec(target.split(".", 1)[0]) is None:
            raise UsageError(
                f"module {target!r} was not found; expected an importable module for -m; "
                "check the name or install the package"
            )
    elif rest:
        target, is_module, args = rest[0], False, tuple(rest[1:])
        if target.startswith("-") or not os.path.isfile(target):
            raise UsageError(
                f"script {target!r} does not exist (relative to {os.getcwd()}); expected "
                f"'{PROG} [script.py | -m module] [args] [options]'; see '{PROG} --help'"
            )
    else:
        target, is_module, args = BUILTIN_JOB[0], True, BUILTIN_JOB[1]
    return ScalingOptions(
        target=target,
        is_module=is_module,
        script_args=args,
        nproc=ns.nproc,
        steps=ns.steps,
        warmup=ns.warmup,
        repeats=ns.repeats,
        as_json=ns.as_json,
        out=ns.out,
        cpu=ns.cpu,
        splits=ns.splits,
        timeout=float(ns.timeout),
    )
