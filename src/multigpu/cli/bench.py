"""``multigpu bench comm|scaling``: the command line of the benchmarks.

``multigpu bench comm [options]``: the sweep (``diagnostics.bench.comm``), then its tables or JSON.

``multigpu bench scaling [script.py | -m module] [script args] [--nproc 1,2] [--steps K] ...``:
as with ``multigpu verify``, bench's own options are recognised by name anywhere on the line;
everything else is the script and its arguments; after ``--`` everything goes to the script.
Without a script: the built-in digits job (``multigpu train``'s).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from multigpu.cli.args import parse_with_target
from multigpu.common.arguments import Parser, options_from, process_counts, whole_arg
from multigpu.common.choices import did_you_mean
from multigpu.diagnostics.bench import comm
from multigpu.diagnostics.bench.scaling import ScalingOptions, bench_scaling
from multigpu.diagnostics.bench.sizes import DEFAULT_SIZES, OPS, parse_ops, parse_sizes
from multigpu.errors import UsageError

PROG = "multigpu bench scaling"
USAGE = """usage: multigpu bench {comm,scaling} [options]

  comm      time all-reduce, all-gather, broadcast, reduce-scatter over a sweep of sizes:
            time, algbw and busbw as nccl-tests defines them ('multigpu bench comm --help')
  scaling   samples/s, speed-up and scaling efficiency of a script (default: the built-in
            digits job) at several world sizes; on CPUs also every processes x threads split,
            the fastest saved for `multigpu run --cpu auto` ('multigpu bench scaling --help')
"""


def bench_main(argv: Sequence[str]) -> int:
    """``multigpu bench ARGV``: 0 on success, 1 when a benchmark failed; UsageError → exit 2."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    if args[0] == "comm":
        return comm_main(args[1:])
    if args[0] == "scaling":
        return scaling_main(args[1:])
    raise UsageError(
        f"'multigpu bench {args[0]}' is not a benchmark; expected 'multigpu bench comm' or "
        f"'multigpu bench scaling'{did_you_mean(args[0], ('comm', 'scaling'))}; see "
        "'multigpu bench --help'"
    )


def scaling_main(argv: Sequence[str]) -> int:
    """``multigpu bench scaling ARGV``: 0 when every run gave a figure, else 1."""
    from multigpu.diagnostics.bench import scaling_report as report

    options = parse_scaling_args(argv)
    if options is None:
        return 0
    with tempfile.TemporaryDirectory(prefix="multigpu-bench-scaling-") as tmp:
        document = bench_scaling(options, Path(tmp))
    if options.out is not None:
        document["files"] = report.write_files(document, options.out)
    if options.as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        report.print_report(document)
    sys.stdout.flush()
    rows = [*document["scaling"], *document["splits"]]
    return 1 if any(r["error"] or r["failed_runs"] for r in rows) else 0


def build_scaling_parser() -> argparse.ArgumentParser:
    """The parser of bench scaling's own options (the script and its arguments are split off)."""
    p = Parser(
        prog=PROG,
        usage=f"{PROG} [script.py | -m module] [script args] [options]",
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
        type=lambda text: tuple(sorted(process_counts(text, example="1,2,4"))),
        default=(1, 2),
        metavar="N,M,...",
        help="world sizes (default 1,2); the smallest is the speed-up's baseline",
    )
    p.add_argument("--steps", type=whole_arg(1), default=50, help="timed optimizer steps (50)")
    p.add_argument("--warmup", type=whole_arg(1), default=5, help="untimed steps before them (5)")
    p.add_argument(
        "--repeats",
        type=whole_arg(1),
        default=1,
        help="runs per configuration, interleaved; medians reported (1)",
    )
    p.add_json()
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
    p.add_timeout(600, "seconds one run may take")
    return p


def parse_scaling_args(argv: Sequence[str]) -> ScalingOptions | None:
    """Parse ``multigpu bench scaling``'s command line; None after printing ``--help``."""
    parsed = parse_with_target(build_scaling_parser(), argv)
    return None if parsed is None else options_from(parsed[0], ScalingOptions, **parsed[1])


def _option_type(parse: Callable[[str], Any], option: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except UsageError as e:  # argparse shows a type error as "argument OPTION: <message>"
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{option}: ")) from e

    return convert


def build_comm_parser() -> argparse.ArgumentParser:
    """The parser of ``multigpu bench comm``."""
    p = Parser(
        prog=comm.PROG,
        description="Time all-reduce, all-gather, broadcast and reduce-scatter over a sweep of "
        "sizes with real worker processes, and report the time (slowest rank's mean), the "
        "algorithm bandwidth S/t and the bus bandwidth as nccl-tests defines them: algbw x "
        "2(n-1)/n for all-reduce, x (n-1)/n for all-gather and reduce-scatter (S = the total "
        "over ranks), x 1 for broadcast. GB = 10^9 bytes.",
    )
    p.add_argument(
        "--sizes",
        type=_option_type(parse_sizes, "--sizes"),
        default=DEFAULT_SIZES,
        metavar="LIST|MIN:MAX[:F]",
        help="sizes in bytes, K/M/G binary: a list (1K,64K) or a range times F (default "
        "16:64M, every power of 4)",
    )
    p.add_argument(
        "--ops",
        type=_option_type(parse_ops, "--ops"),
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


def parse_comm_args(argv: Sequence[str]) -> comm.CommOptions:
    """Parse ``multigpu bench comm``'s options (``--help`` raises SystemExit(0) after printing)."""
    return options_from(build_comm_parser().parse_args(list(argv)), comm.CommOptions)


def comm_main(argv: Sequence[str]) -> int:
    """``multigpu bench comm ARGV``: 0 on success, 1 when the workers failed."""
    options = parse_comm_args(argv)
    with tempfile.TemporaryDirectory(prefix="multigpu-bench-comm-") as tmp:
        document = comm.bench_comm(options, Path(tmp))
    if options.as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        comm.print_report(document)
    sys.stdout.flush()
    return 0 if all(row["correct"] for row in document["rows"]) else 1
