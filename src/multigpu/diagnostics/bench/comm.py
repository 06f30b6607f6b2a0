"""``multigpu bench comm``: time the collectives over a sweep of sizes, as nccl-tests does.

It starts ``multigpu.diagnostics.bench.comm_worker`` through the launcher (``python -m multigpu
run --cpu N -m ...``, or ``--gpus N`` on a machine with GPUs), waits for it, and prints rank 0's
results: per collective and size, the time (the slowest rank's mean), the algorithm bandwidth
and the bus bandwidth (``bandwidth``). CPU workers use loopback (``GLOO_SOCKET_IFNAME=lo``).

Environment variables read: none directly; the child gets the caller's environment plus
``GLOO_SOCKET_IFNAME=lo`` on CPU (``multigpu.gpus`` reads ``CUDA_VISIBLE_DEVICES``...).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from multigpu.diagnostics.bench.comm_report import print_report
from multigpu.diagnostics.bench.sizes import DEFAULT_SIZES, OPS, parse_ops, parse_sizes
from multigpu.diagnostics.bench.splits import load_before
from multigpu.diagnostics.child_run import run_child
from multigpu.errors import UsageError

log = logging.getLogger(__name__)

PROG = "multigpu bench comm"
WORKER = "multigpu.diagnostics.bench.comm_worker"


@dataclass(frozen=True, kw_only=True)
class CommOptions:
    """What ``multigpu bench comm`` was asked to measure."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    """Sizes ``S`` in bytes (for all-gather and reduce-scatter: the total over ranks)."""
    ops: tuple[str, ...] = OPS
    """Collectives, in order."""
    iters: int = 20
    """Timed calls per collective and size."""
    warmup: int = 5
    """Untimed calls before them."""
    nproc: int | None = None
    """Processes (GPUs); None: 2 on CPU, every GPU on a machine with GPUs."""
    cpu: bool = False
    """CPU processes (gloo) even on a machine with GPUs."""
    as_json: bool = False
    """Print the JSON document instead of tables."""
    timeout: float = 900.0
    """Seconds the whole sweep may take."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see '{PROG} --help'")


def _whole(low: int) -> Any:
    def parse(text: str) -> int:
        value = int(text) if text.strip().lstrip("-").isdigit() else low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {low}")
        return value

    return parse


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
    p = _Parser(
        prog=PROG,
        allow_abbrev=False,
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
    p.add_argument("--iters", type=_whole(1), default=20, help="timed calls per size (20)")
    p.add_argument("--warmup", type=_whole(0), default=5, help="untimed calls before them (5)")
    p.add_argument(
        "--nproc",
        type=_whole(2),
        metavar="N",
        help="processes: default 2 on CPU, every GPU on a machine with GPUs",
    )
    p.add_argument("--cpu", action="store_true", help="CPU processes (gloo) even with GPUs")
    p.add_argument("--json", dest="as_json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--timeout", type=_whole(1), default=900, help="seconds the sweep may take (900)"
    )
    return p


def parse_comm_args(argv: Sequence[str]) -> CommOptions:
    """Parse ``multigpu bench comm``'s options (``--help`` raises SystemExit(0) after printing).

    Example:
        >>> parse_comm_args(["--sizes", "1K,64K", "--nproc", "2"]).sizes
        (1024, 65536)
    """
    ns = build_comm_parser().parse_args(list(argv))
    return CommOptions(
        sizes=ns.sizes,
        ops=ns.ops,
        iters=ns.iters,
        warmup=ns.warmup,
        nproc=ns.nproc,
        cpu=ns.cpu,
        as_json=ns.as_json,
        timeout=float(ns.timeout),
    )


def comm_devices(options: CommOptions) -> tuple[str, int]:
    """(``"cpu"`` or ``"cuda"``, number of processes) for this machine and the options.

    Raises:
        UsageError: more GPUs asked for than the machine shows.
    """
    gpus = 0
    if not options.cpu:
        from multigpu.gpus import list_gpus

        gpus = len(list_gpus())
    if gpus == 0:
        return "cpu", options.nproc or 2
    nproc = options.nproc or gpus
    if nproc > gpus:
        raise UsageError(
            f"--nproc {nproc} asks for {nproc} GPUs but this machine shows {gpus}; use "
            f"--nproc {gpus} or fewer, or --cpu for CPU processes"
        )
    return "cuda", nproc


def worker_command(options: CommOptions, device: str, nproc: int, out: Path) -> list[str]:
    """The ``multigpu run`` command line of the sweep.

    Example:
        >>> opts = CommOptions(sizes=(8,), ops=("broadcast",))
        >>> worker_command(opts, "cpu", 2, Path("r.json"))[3:6]
        ['run', '--cpu', '2']
    """
    devices = ["--gpus" if device == "cuda" else "--cpu", str(nproc)]
    return [
        sys.executable,
        *("-m", "multigpu", "run", *devices, "-m", WORKER),
        *("--out", str(out), "--sizes", ",".join(map(str, options.sizes))),
        *("--ops", ",".join(options.ops), "--iters", str(options.iters)),
        *("--warmup", str(options.warmup)),
    ]


def bench_comm(options: CommOptions, directory: Path) -> dict[str, Any]:
    """Run the sweep; return rank 0's JSON document (plus ``command`` and ``seconds``).

    Raises:
        LaunchError: the workers failed (the message ends with their stderr).

    Example:
        >>> doc = bench_comm(CommOptions(sizes=(1024,)), Path("/tmp/c"))  # doctest: +SKIP
        >>> doc["rows"][0]["busbw_gbps"]  # doctest: +SKIP
    """
    from multigpu.errors import LaunchError

    device, nproc = comm_devices(options)
    out = directory / "comm.json"
    command = worker_command(options, device, nproc, out)
    env = dict(os.environ)
    if device == "cpu":
        env["GLOO_SOCKET_IFNAME"] = "lo"  # one machine: loopback, whatever the hostname says
    what = f"{nproc} GPUs (nccl)" if device == "cuda" else f"{nproc} CPU processes (gloo)"
    log.info(
        "bench comm: %s, %d collective(s) x %d size(s) ...",
        what,
        len(options.ops),
        len(options.sizes),
    )
    load = load_before()  # before our own workers add to it
    run = run_child(command, env, timeout=options.timeout, logs=directory / "comm")
    if run.returncode != 0 or not out.is_file():
        raise LaunchError(
            f"the benchmark workers failed (exit code {run.returncode}): "
            f"{run.reason or 'no error line'}; their "
            f"stderr ends with:\n{run.stderr_tail}"
        )
    document: dict[str, Any] = json.loads(out.read_text())
    document.update(command=command, seconds=round(run.seconds, 2), load_before=load)
    return document


def comm_main(argv: Sequence[str]) -> int:
    """``multigpu bench comm ARGV``: 0 on success, 1 when the workers failed.

    Example:
        >>> comm_main(["--nproc", "2", "--sizes", "1K,64K", "--json"])  # doctest: +SKIP
        0
    """
    options = parse_comm_args(argv)
    with tempfile.TemporaryDirectory(prefix="multigpu-bench-comm-") as tmp:
        document = bench_comm(options, Path(tmp))
    if options.as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        print_report(document)
    sys.stdout.flush()
    return 0 if all(row["correct"] for row in document["rows"]) else 1
