"""The PNG of ``multigpu bench scaling``: speed-up against world size, and the CPU splits.

matplotlib is an optional extra (``pip install 'multigpu[plot]'``); without it no plot is
written and the caller prints one line saying so. Only the object API (``Figure``) is used, so
no GUI backend or global pyplot state is touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from multigpu.diagnostics.bench.scaling_report import row_throughput

NO_MATPLOTLIB = (
    "no plot: matplotlib is not installed (pip install 'multigpu[plot]' or 'matplotlib>=3.5')"
)


def write_plot(document: Mapping[str, Any], path: Path) -> bool:
    """Draw the scaling result into ``path`` (PNG); False when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    splits = [r for r in document["splits"] if row_throughput(r) is not None]
    fig = Figure(figsize=(8.0, 3.3) if splits else (4.4, 3.3), dpi=100, layout="constrained")
    axes = fig.subplots(1, 2 if splits else 1, squeeze=False)[0]
    unit = "samples/s" if document["samples_per_step"] else "steps/s"
    rows = [r for r in document["scaling"] if r["speedup"] is not None]
    ax = axes[0]
    if rows:
        sizes = [r["processes"] for r in rows]
        ideal = [n / sizes[0] for n in sizes]
        ax.plot(sizes, ideal, "--", color="0.6", label="ideal (linear)")
        ax.plot(sizes, [r["speedup"] for r in rows], "o-", color="C0", label="measured")
        for r in rows:
            # Above the point, where neither line runs (the ideal line rises to the right of
            # it, the measured one joins it from the side), on a white box over the grid.
            ax.annotate(
                f"{r['speedup']:.2f}x\neff. {r['efficiency']:.0%}",
                (r["processes"], r["speedup"]),
                textcoords="offset points",
                xytext=(0, 9),
                ha="center",
                va="bottom",
                fontsize=8,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
            )
        ax.set_xticks(sizes)
        # Room for the labels: the first and last points away from the sides, the tallest
        # label inside the axes, and the speed-up read from zero.
        ax.margins(x=0.15)
        top = max([*ideal, *(r["speedup"] for r in rows)])
        ax.set_ylim(0, top * 1.3)
    what = "processes x 1 thread" if document["device"] == "cpu" else "GPUs"
    ax.set_xlabel(f"world size ({what})")
    ax.set_ylabel("speed-up over the smallest world size")
    ax.set_title("strong scaling, fixed global batch", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    if splits:
        best = document.get("recommendation") or {}
        labels = [f"{r['processes']}x{r['threads']}" for r in splits]
        values = [float(row_throughput(r) or 0.0) for r in splits]
        colors = [
            "C2"
            if (r["processes"], r["threads"]) == (best.get("processes"), best.get("threads"))
            else "C7"
            for r in splits
        ]
        bars = axes[1].bar(labels, values, color=colors)
        axes[1].bar_label(bars, fmt="%.0f", fontsize=8)
        axes[1].margins(y=0.12)  # room for the labels above the tallest bar
        axes[1].set_xlabel("processes x threads")
        axes[1].set_ylabel(unit)
        axes[1].set_title(f"splits of {document['cores']} cores (green: fastest)", fontsize=9)
        axes[1].grid(alpha=0.3, axis="y")
    target = ("-m " if document["is_module"] else "") + Path(document["target"]).name
    fig.suptitle(
        f"multigpu bench scaling: {target} ({document['device']}, torch {document['torch']})",
        fontsize=10,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return True
