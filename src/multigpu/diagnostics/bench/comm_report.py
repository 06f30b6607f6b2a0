"""The tables of ``multigpu bench comm``: one per collective, nccl-tests' columns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

from rich.table import Table

from multigpu.diagnostics.bench.sizes import OPS, format_size
from multigpu.diagnostics.bench.splits import report_console

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
