"""``multigpu bench comm``'s command line: its options, then the sweep (``diagnostics.bench.comm``)
and the report, as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from multigpu.arguments import Parser, options_from, whole_arg
from multigpu.diagnostics.bench.comm import PROG, CommOptions, bench_comm
from multigpu.diagnostics.bench.comm_report import print_report
from multigpu.diagnostics.bench.sizes import DEFAULT_SIZES, OPS, parse_ops, parse_sizes
from multigpu.errors import UsageError


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_sizes(text)
    except UsageError as e:  # argparse shows a type error as "argument --sizes: <message>"
        raise argparse.ArgumentTypeError(str(e).removeprefix("--sizes: ")) from e


def _ops(text: str) -> tuple[str, ...]:
    try:
        return parse_ops(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--ops: ")) from e


def build_comm_parser() -> argparse.ArgumentParser:
    """The parser of ``multigpu bench comm``."""
    p = Parser(
        prog=PROG,
        description="Time all-reduce, all-gather, broadcast and reduce-scatter over a sweep of "
        "sizes with real worker processes, and report the time (slowest rank's mean), the "
        "algorithm bandwidth S/t and the bus bandwidth as nccl-tests defines them: algbw x "
        "2(n-1)/n for all-reduce, x (n-1)/n for all-gather and reduce-scatter (S = the total "
        "over ranks), x 1 for broadcast. GB = 10^9 bytes.",
    )
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=DEFAULT_SIZES,
        metavar="LIST|MIN:MAX[:F]",
        help="sizes in bytes, K/M/G binary: a list (1K,64K) or a range times F (default "
        "16:64M, every power of 4)",
    )
    p.add_argument(
        "--ops",
        type=_ops,
        default=OPS,
        metavar="OP,...",
        help=f"collectives (default all: {','.join(OPS)})",
    )
    p.add_argument("--iters", type=whole_arg(1), default=20, help="timed calls per size (20)")
    p.add_argument("--warmup", type=whole_arg(0), default=5, help="untimed calls before them (5)")
    p.add_argument(
        "--nproc",
        type=whole_arg(2),
        metavar="N",
        help="processes: default 2 on CPU, every GPU on a machine with GPUs",
    )
    p.add_argument("--cpu", action="store_true", help="CPU processes (gloo) even with GPUs")
    p.add_json()
    p.add_timeout(900, "seconds the sweep may take")
    return p


def parse_comm_args(argv: Sequence[str]) -> CommOptions:
    """Parse ``multigpu bench comm``'s options (``--help`` raises SystemExit(0) after printing)."""
    return options_from(build_comm_parser().parse_args(list(argv)), CommOptions)


def comm_main(argv: Sequence[str]) -> int:
    """``multigpu bench comm ARGV``: 0 on success, 1 when the workers failed."""
    options = parse_comm_args(argv)
    with tempfile.TemporaryDirectory(prefix="multigpu-bench-comm-") as tmp:
        document = bench_comm(options, Path(tmp))
    if options.as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        print_report(document)
    sys.stdout.flush()
    return 0 if all(row["correct"] for row in document["rows"]) else 1
