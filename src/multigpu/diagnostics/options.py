"""The command line of ``multigpu verify``: its options, taken out of the script's arguments.

``multigpu verify [script.py | -m module] [script args] [--nproc 1,2] [--steps K] ...``: verify's
own options are recognised by name anywhere on the line (like ``multigpu train``'s launch
options); everything else is the script and its arguments, in order. ``--`` ends verify's
options: what follows goes to the script even if it has the same name (``-- --steps 5``).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from multigpu.errors import UsageError

PROG = "multigpu verify"
VERIFY_STRATEGIES = ("auto", "single", "ddp", "fsdp")
"""What ``--strategy`` accepts (dp is one process: nothing to compare across world sizes)."""
BUILTIN_JOB = ("multigpu.examples.digits", ("--progress", "off"))
"""The job verified when no script is given: the digits CNN, as ``-m`` module and arguments."""

DESCRIPTION = (
    "Check that a training script gives the same results at every world size: run it for "
    "--steps optimizer steps at each world size of --nproc and compare the final parameters "
    "(per tensor: max|a-b| and max|a-b| / max|b|), the number of steps and the per-step global "
    "loss against the first world size; on failure, say what breaks the invariance. The script "
    "must call multigpu.init() (records are taken there), use the same seed at every world "
    "size and pass the GLOBAL batch to ctx.loader (multigpu's loader then makes the data order "
    "and the global batch independent of the world size). Without a script: the built-in "
    "digits job. Exit code 0 PASS, 1 FAIL, 2 bad input."
)
EPILOG = (
    "Default tolerance (relative to each tensor's largest value, and to each loss): float32 "
    "1e-4, float64 1e-10, bf16/fp16 weights or mixed precision 1e-2. Options are recognised "
    "anywhere; after '--' everything goes to the script."
)


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    """What ``multigpu verify`` was asked to do."""

    target: str
    """The script's path, or the module with ``is_module``."""
    is_module: bool
    """``target`` is a module (``-m``)."""
    script_args: tuple[str, ...] = ()
    """Arguments passed to the script unchanged."""
    nproc: tuple[int, ...] = (1, 2)
    """World sizes, the reference first."""
    steps: int = 50
    """Optimizer steps recorded at each world size."""
    as_json: bool = False
    """Print one JSON object instead of the table."""
    deterministic: bool = False
    """Run the workers with deterministic algorithms (``MULTIGPU_DETERMINISTIC=1``)."""
    rtol: float | None = None
    """Relative tolerance; None: by dtype and precision."""
    atol: float = 0.0
    """Absolute tolerance."""
    keep: Path | None = None
    """Keep the run directories here (else a temporary directory removed at the end)."""
    cpu: bool = False
    """CPU processes even on a machine with GPUs."""
    timeout: float = 900.0
    """Seconds one run may take before it is stopped."""
    strategy: str | None = None
    """The strategy of every run (``MULTIGPU_STRATEGY``), for scripts that leave it to init()."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see '{PROG} --help'")


def _nproc(text: str) -> tuple[int, ...]:
    sizes: list[int] = []
    for part in text.split(","):
        try:
            size = int(part)
        except ValueError:
            size = 0
        if size < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a list of process counts; expected numbers >= 1 "
                "separated by commas, e.g. --nproc 1,2"
            )
        if size not in sizes:
            sizes.append(size)
    if len(sizes) < 2:
        raise argparse.ArgumentTypeError(
            f"{text!r} names one world size; expected at least two different ones to "
            "compare, e.g. --nproc 1,2"
        )
    return tuple(sizes)


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


def build_verify_parser() -> argparse.ArgumentParser:
    """The parser of verify's own options (the script and its arguments are split off first)."""
    p = _Parser(
        prog=PROG,
        usage=f"{PROG} [script.py | -m module] [script args] [options]",
        description=DESCRIPTION,
        epilog=EPILOG,
        allow_abbrev=False,
    )
    p.add_argument("-m", dest="module", metavar="MODULE", help="verify a module (python -m)")
    p.add_argument(
        "--nproc",
        type=_nproc,
        default=(1, 2),
        metavar="N,M,...",
        help="world sizes to compare, the first is the reference (default 1,2)",
    )
    p.add_argument(
        "--steps",
        type=number_arg(int, 1),
        default=50,
        help="optimizer steps to record at each world size (default 50)",
    )
    p.add_argument("--json", dest="as_json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic algorithms in the workers (MULTIGPU_DETERMINISTIC=1, "
        "CUBLAS_WORKSPACE_CONFIG=:4096:8)",
    )
    p.add_argument(
        "--rtol",
        type=number_arg(float, 0),
        help="relative tolerance (default by dtype: see below)",
    )
    p.add_argument("--atol", type=number_arg(float, 0), default=0.0, help="absolute tolerance (0)")
    p.add_argument("--keep", metavar="DIR", type=Path, help="keep the run directories in DIR")
    p.add_argument(
        "--cpu",
        action="store_true",
        help="run CPU processes (gloo) even on a machine with GPUs (default: GPUs when present)",
    )
    p.add_argument(
        "--timeout",
        type=number_arg(float, 1),
        default=900.0,
        help="seconds one run may take before it is stopped (900)",
    )
    p.add_argument(
        "--strategy",
        choices=VERIFY_STRATEGIES,
        help="run every world size under this strategy (MULTIGPU_STRATEGY; the built-in job "
        "and scripts that call multigpu.init() without one follow it), e.g. --strategy fsdp",
    )
    return p


def split_verify_args(
    argv: Sequence[str], parser: argparse.ArgumentParser
) -> tuple[list[str], list[str]]:
    """Split ``argv`` into (verify's options, the script and its arguments).

    Example:
        >>> split_verify_args(["train.py", "--lr", "1", "--nproc", "1,2"], build_verify_parser())
        (['--nproc', '1,2'], ['train.py', '--lr', '1'])
    """
    takes_value = {
        name: action.nargs != 0 for action in parser._actions for name in action.option_strings
    }
    own: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if token == "--":
            rest.extend(argv[i + 1 :])
            break
        if token.startswith("-") and name in takes_value:
            own.append(token)
            if takes_value[name] and "=" not in token and i + 1 < len(argv):
                own.append(argv[i + 1])
                i += 1
        else:
            rest.append(token)
        i += 1
    return own, rest


def parse_verify_args(argv: Sequence[str]) -> VerifyOptions | None:
    """Parse ``multigpu verify``'s command line; None when it asked for ``--help`` (printed).

    Raises:
        UsageError: a bad option, a missing script or module (exit code 2).

    Example:
        >>> parse_verify_args(["--nproc", "1,2", "--steps", "20"]).target
        'multigpu.examples.digits'
    """
    parser = build_verify_parser()
    own, rest = split_verify_args(argv, parser)
    if "-h" in own or "--help" in own:
        parser.print_help()
        return None
    ns = parser.parse_args(own)
    if ns.module is not None:
        target, is_module, args = ns.module, True, tuple(rest)
        _check_module(target)
    elif rest:
        if rest[0].startswith("-"):
            raise UsageError(
                f"unknown option {rest[0]!r} before the script; expected "
                f"'{PROG} [script.py | -m module] [args] [options]'; see '{PROG} --help'"
            )
        target, is_module, args = rest[0], False, tuple(rest[1:])
        _check_script(target)
    else:
        target, is_module, args = BUILTIN_JOB[0], True, BUILTIN_JOB[1]
    return VerifyOptions(
        target=target,
        is_module=is_module,
        script_args=args,
        nproc=ns.nproc,
        steps=ns.steps,
        as_json=ns.as_json,
        deterministic=ns.deterministic,
        rtol=ns.rtol,
        atol=ns.atol,
        keep=ns.keep,
        cpu=ns.cpu,
        timeout=ns.timeout,
        strategy=ns.strategy,
    )


def _check_script(script: str) -> None:
    if not os.path.isfile(script):
        where = "" if os.path.isabs(script) else f" (relative to {os.getcwd()})"
        raise UsageError(
            f"script {script!r} does not exist{where}; expected a Python file; check the path, "
            "or use -m for a module"
        )


def _check_module(module: str) -> None:
    top = module.split(".", 1)[0]
    # Only the top-level package is looked up: finding a submodule would import its parents.
    if not module or importlib.util.find_spec(top) is None:
        raise UsageError(
            f"module {module!r} was not found (no package {top!r} on sys.path); expected an "
            "importable module for -m; check the name or install the package"
        )


def choose_device(nproc: Sequence[int], *, cpu: bool) -> str:
    """``"cuda"`` when the machine has GPUs (and not ``cpu``), else ``"cpu"``: the device on
    which a diagnostic (verify, bench scaling) runs its world sizes ``nproc``.

    Raises:
        UsageError: ``nproc`` asks for more GPUs than the machine has.
    """
    if cpu:
        return "cpu"
    from multigpu.gpus import list_gpus

    count = len(list_gpus())
    if count == 0:
        return "cpu"
    if max(nproc) > count:
        raise UsageError(
            f"--nproc {','.join(map(str, nproc))} asks for {max(nproc)} GPUs but this machine "
            f"shows {count}; use world sizes up to {count}, or --cpu for CPU processes"
        )
    return "cuda"
