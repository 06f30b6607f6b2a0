"""``multigpu bench comm|scaling``: the command line of the benchmarks.

``multigpu bench scaling [script.py | -m module] [script args] [--nproc 1,2] [--steps K] ...``:
as with ``multigpu verify``, bench's own options are recognised by name anywhere on the line;
everything else is the script and its arguments; after ``--`` everything goes to the script.
Without a script: the built-in digits job (``multigpu train``'s).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from multigpu.arguments import Parser, options_from, process_counts, whole_arg
from multigpu.cli.args import parse_with_target
from multigpu.diagnostics.bench.scaling_options import ScalingOptions
from multigpu.diagnostics.options import BUILTIN_JOB
from multigpu.errors import UsageError

log = logging.getLogger(__name__)

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
        from multigpu.cli.bench_comm import comm_main

        return comm_main(args[1:])
    if args[0] == "scaling":
        return scaling_main(args[1:])
    raise UsageError(
        f"'multigpu bench {args[0]}' is not a benchmark; expected 'multigpu bench comm' or "
        "'multigpu bench scaling'; see 'multigpu bench --help'"
    )


def scaling_main(argv: Sequence[str]) -> int:
    """``multigpu bench scaling ARGV``: 0 when every run gave a figure, else 1."""
    from multigpu.diagnostics.bench.plot import NO_MATPLOTLIB, write_plot
    from multigpu.diagnostics.bench.scaling_report import print_report, write_files
    from multigpu.diagnostics.bench.scaling_result import bench_scaling

    options = parse_scaling_args(argv)
    if options is None:
        return 0
    with tempfile.TemporaryDirectory(prefix="multigpu-bench-scaling-") as tmp:
        document = bench_scaling(options, Path(tmp))
    if options.out is not None:
        files = write_files(document, options.out)
        png = options.out / "scaling.png"
        if write_plot(document, png):
            files["png"] = str(png)
        else:
            log.info("%s", NO_MATPLOTLIB)
        document["files"] = files
        Path(files["json"]).write_text(json.dumps(document, indent=2) + "\n")  # with its files
    if options.as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        print_report(document)
    sys.stdout.flush()
    rows = [*document["scaling"], *document["splits"]]
    return 1 if any(r["error"] or r["failed_runs"] for r in rows) else 0


def _scaling_nproc(text: str) -> tuple[int, ...]:
    return tuple(sorted(process_counts(text, example="1,2,4")))


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
        type=_scaling_nproc,
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
    parsed = parse_with_target(build_scaling_parser(), argv, BUILTIN_JOB)
    if parsed is None:
        return None
    ns, target, is_module, args = parsed
    return options_from(ns, ScalingOptions, target=target, is_module=is_module, script_args=args)
