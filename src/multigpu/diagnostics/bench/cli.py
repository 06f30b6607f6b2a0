"""``multigpu bench comm|scaling``: the command line of the benchmarks.

Environment variables read: none here (see ``comm``, ``scaling`` and ``cache``).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from multigpu.errors import UsageError

log = logging.getLogger(__name__)

USAGE = """usage: multigpu bench {comm,scaling} [options]

  comm      time all-reduce, all-gather, broadcast, reduce-scatter over a sweep of sizes:
            time, algbw and busbw as nccl-tests defines them ('multigpu bench comm --help')
  scaling   samples/s, speed-up and scaling efficiency of a script (default: the built-in
            digits job) at several world sizes; on CPUs also every processes x threads split,
            the fastest saved for `multigpu run --cpu auto` ('multigpu bench scaling --help')
"""


def bench_main(argv: Sequence[str]) -> int:
    """``multigpu bench ARGV``: 0 on success, 1 when a benchmark failed; UsageError → exit 2.

    Example:
        >>> bench_main(["comm", "--sizes", "1K,64K", "--json"])  # doctest: +SKIP
        0
    """
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    if args[0] == "comm":
        from multigpu.diagnostics.bench.comm import comm_main

        return comm_main(args[1:])
    if args[0] == "scaling":
        return scaling_main(args[1:])
    raise UsageError(
        f"'multigpu bench {args[0]}' is not a benchmark; expected 'multigpu bench comm' or "
        "'multigpu bench scaling'; see 'multigpu bench --help'"
    )


def scaling_main(argv: Sequence[str]) -> int:
    """``multigpu bench scaling ARGV``: 0 when every run gave a figure, else 1.

    Example:
        >>> scaling_main(["--nproc", "1,2", "--steps", "20", "--json"])  # doctest: +SKIP
        0
    """
    from multigpu.diagnostics.bench.plot import NO_MATPLOTLIB, write_plot
    from multigpu.diagnostics.bench.scaling_options import parse_scaling_args
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
    failed = [r for r in rows if r["error"] or r["failed_runs"]]
    return 1 if failed else 0
