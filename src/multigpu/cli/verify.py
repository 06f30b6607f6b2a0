"""The command line of ``multigpu verify``: its options, taken out of the script's arguments.

``multigpu verify [script.py | -m module] [script args] [--nproc 1,2] [--steps K]
[--accumulation 1,4] ...``: verify's
own options are recognised by name anywhere on the line (like ``multigpu train``'s launch
options); everything else is the script and its arguments, in order. ``--`` ends verify's
options: what follows goes to the script even if it has the same name (``-- --steps 5``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from multigpu.cli.args import parse_with_target
from multigpu.common.arguments import Parser, number_arg, options_from, process_counts
from multigpu.diagnostics.options import VERIFY_STRATEGIES, VerifyOptions

PROG = "multigpu verify"

DESCRIPTION = (
    "Check that a training script gives the same results at every world size: run it for "
    "--steps optimizer steps at each world size of --nproc and compare the final parameters "
    "(per tensor: max|a-b| and max|a-b| / max|b|), the number of steps and the per-step global "
    "loss against the first world size (with --accumulation, at every accumulation too, against "
    "the first of each); on failure, say what breaks the invariance. The script "
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


def _nproc(text: str) -> tuple[int, ...]:
    return tuple(process_counts(text))


def _accumulation(text: str) -> tuple[int, ...]:
    steps = process_counts(text, "1,4", what="accumulation steps", option="--accumulation")
    if len(steps) < 2:
        raise argparse.ArgumentTypeError(
            f"{text!r} names one number of accumulation steps; expected at least two different "
            "ones to compare, e.g. --accumulation 1,4"
        )
    return tuple(steps)


def build_verify_parser() -> argparse.ArgumentParser:
    """The parser of verify's own options (the script and its arguments are split off first)."""
    p = Parser(
        prog=PROG,
        usage=f"{PROG} [script.py | -m module] [script args] [options]",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    p.add_argument("-m", dest="module", metavar="MODULE", help="verify a module (python -m)")
    p.add_argument(
        "--nproc",
        type=_nproc,
        metavar="N,M,...",
        help="world sizes to compare, the first is the reference (default 1,2; one is enough "
        "with --accumulation)",
    )
    p.add_argument(
        "--accumulation",
        type=_accumulation,
        metavar="K,L,...",
        help="accumulation steps to compare too, the first is the reference: every world size "
        "runs at each, the script getting --accumulation-steps K after its arguments (to pass "
        "to ctx.loader(..., accumulation_steps=K); the built-in jobs take it)",
    )
    p.add_argument(
        "--steps",
        type=number_arg(int, 1),
        default=50,
        help="optimizer steps to record at each world size (default 50)",
    )
    p.add_json("one JSON object")
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
        help="run CPU processes (gloo) even on a machine with GPUs (default: GPUs when present; "
        "CPU processes when the default sizes 1,2 meet a single GPU)",
    )
    p.add_timeout(900, "seconds one run may take before it is stopped")
    p.add_argument(
        "--strategy",
        choices=VERIFY_STRATEGIES,
        help="run every world size under this strategy (MULTIGPU_STRATEGY; the built-in job "
        "and scripts that call multigpu.init() without one follow it), e.g. --strategy fsdp",
    )
    return p


def parse_verify_args(argv: Sequence[str]) -> VerifyOptions | None:
    """Parse ``multigpu verify``'s command line; None when it asked for ``--help`` (printed)."""
    parser = build_verify_parser()
    parsed = parse_with_target(parser, argv)
    if parsed is None:
        return None
    ns, target = parsed
    if ns.nproc is not None and len(ns.nproc) < 2 and ns.accumulation is None:
        sizes = ",".join(map(str, ns.nproc))
        parser.error(
            f"argument --nproc: {sizes!r} names one world size; expected at least two different "
            "ones to compare, e.g. --nproc 1,2 (or one with --accumulation 1,4)"
        )
    given = ns.nproc is not None
    ns.nproc = ns.nproc or VerifyOptions.nproc
    return options_from(ns, VerifyOptions, **target, nproc_given=given)


def verify_main(argv: Sequence[str]) -> int:
    """``multigpu verify ARGV``: 0 PASS, 1 FAIL; a UsageError (exit 2) is the caller's to print."""
    options = parse_verify_args(argv)
    if options is None:
        return 0
    from multigpu.diagnostics.verify import verify_command

    return verify_command(options)
