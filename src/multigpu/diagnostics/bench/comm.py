"""``multigpu bench comm``: time the collectives over a sweep of sizes, as nccl-tests does, and
print the tables (one per collective, nccl-tests' columns).

It starts ``multigpu.diagnostics.bench.comm_worker`` through the launcher (``python -m multigpu
run --cpu N -m ...``, or ``--gpus N`` on a machine with GPUs), waits for it, and prints rank 0's
results: per collective and size, the time (the slowest rank's mean), the algorithm bandwidth
and the bus bandwidth (``bandwidth``). CPU workers use loopback (``GLOO_SOCKET_IFNAME=lo``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rich.table import Table

from multigpu.diagnostics.bench.sizes import DEFAULT_SIZES, OPS, format_size
from multigpu.diagnostics.bench.splits import load_before, report_console
from multigpu.diagnostics.child_run import run_child
from multigpu.errors import LaunchError, UsageError
from multigpu.launch.engine_topology import one_machine_env

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


def comm_devices(options: CommOptions) -> tuple[str, int]:
    """(``"cpu"`` or ``"cuda"``, number of processes); UsageError for more GPUs than there are."""
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
    """The ``multigpu run`` command line of the sweep."""
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
    """
    device, nproc = comm_devices(options)
    out = directory / "comm.json"
    command = worker_command(options, device, nproc, out)
    env = one_machine_env(os.environ)  # this machine's processes, also in a pod of a job
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


FACTORS = {
    "all_reduce": "2(n-1)/n",
    "all_gather": "(n-1)/n",
    "reduce_scatter": "(n-1)/n",
    "broadcast": "1",
}
"""The bus-bandwidth factor of each collective, as printed in the titles."""


def headline(document: Mapping[str, Any]) -> str:
    """The first line: what ran, how it was timed."""
    return (
        f"bench comm: {document['world_size']} processes, {document['backend']} on "
        f"{document['device']}, {document['dtype']}, torch {document['torch']}; time = the "
        f"slowest rank's mean of {document['iters']} calls after {document['warmup']} warm-up; "
        "GB/s = 10^9 bytes/s"
    )


ONE_PROCESS = (
    "one process: nothing crossed a link, so there is no bus bandwidth to report (the times "
    "show the backend works); use --nproc 2 or more, or --cpu for CPU processes"
)


def peak_lines(document: Mapping[str, Any]) -> list[str]:
    """One line per collective: its best bus bandwidth and the size it was reached at."""
    if document.get("world_size") == 1:  # seen on a 1-GPU machine: "peak busbw 0.000 GB/s"
        return [ONE_PROCESS]
    lines = []
    rows = document["rows"]
    for op in OPS:
        mine = [r for r in rows if r["op"] == op]
        if mine:
            best = max(mine, key=lambda r: r["busbw_gbps"])
            size = format_size(best["size_bytes"])
            lines.append(f"peak busbw {op}: {best['busbw_gbps']:.3f} GB/s at {size}")
    return lines


def print_report(document: Mapping[str, Any], file: TextIO | None = None) -> None:
    """Print the headline, a table per collective, the notes and the peak bus bandwidths."""
    load = document.get("load_before") if document["backend"] == "gloo" else None
    console = report_console(headline(document), load, file)
    notes: Mapping[str, str] = document.get("notes", {})
    n = document["world_size"]
    for op in OPS:
        rows = [r for r in document["rows"] if r["op"] == op]
        if not rows:
            continue
        title = f"{op}  (busbw = algbw x {FACTORS[op]}, n = {n})"
        if op in notes:
            title += f"\n{notes[op]}"
        table = Table(title=title, title_justify="left", title_style="bold")
        for column in ("size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "check"):
            table.add_column(column, justify="left" if column == "check" else "right")
        for r in rows:
            table.add_row(
                format_size(r["size_bytes"]),
                str(r["count"]),
                f"{r['time_us']:.1f}",
                f"{r['algbw_gbps']:.3f}",
                f"{r['busbw_gbps']:.3f}" if n > 1 else "-",
                "ok" if r["correct"] else "WRONG",
            )
        console.print(table)
    for line in peak_lines(document):
        console.print(line, markup=False)
