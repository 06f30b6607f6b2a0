"""What ``multigpu bench scaling`` prints and writes: tables, scaling.json, scaling.csv, and
scaling.png (speed-up against world size, and the CPU splits).

matplotlib is an optional extra (``pip install 'multigpu[plot]'``); without it no plot is
written and the caller prints one line saying so. Only the object API (``Figure``) is used, so
no GUI backend or global pyplot state is touched.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.table import Table

from multigpu.diagnostics.bench.splits import report_console, split_label

log = logging.getLogger(__name__)

CSV_COLUMNS = (
    "table",
    "processes",
    "threads",
    "samples_per_second",
    "steps_per_second",
    "step_ms",
    "samples_per_second_mean",
    "timed_steps",
    "speedup",
    "efficiency",
    "error",
)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _threads(row: Mapping[str, Any]) -> str:
    return split_label(row["processes"], row["threads"])


def _unit(document: Mapping[str, Any]) -> str:
    return "samples/s" if document["samples_per_step"] else "steps/s"


def row_throughput(row: Mapping[str, Any]) -> float | None:
    """A JSON row's samples/s, or steps/s for a script without ``ctx.loader``."""
    value = row["samples_per_second"]
    return value if value is not None else row["steps_per_second"]


def _is_fastest(row: Mapping[str, Any], document: Mapping[str, Any]) -> bool:
    """The split ``document``'s recommendation names."""
    best = document.get("recommendation") or {}
    return (row["processes"], row["threads"]) == (best.get("processes"), best.get("threads"))


def _note(row: Mapping[str, Any], document: Mapping[str, Any]) -> str:
    if row["error"]:
        return "failed (below)"
    if row.get("failed_runs"):
        return "a run failed (below)"
    if row["timed_steps"] < document["steps"]:
        return f"{row['timed_steps']} steps (below)"
    return ""


def problem_lines(document: Mapping[str, Any]) -> list[str]:
    """Whole lines for the rows that failed or timed fewer steps than asked (unwrapped).

    Example:
        >>> problem_lines({"steps": 50, "scaling": [], "splits": [{"processes": 1, "threads": 2,
        ...     "error": "exit code 2: boom", "timed_steps": 0}]})
        ['1x2: exit code 2: boom']
    """
    lines = []
    for row in [*document["scaling"], *document["splits"]]:
        label = _threads(row)
        if row["error"]:
            lines.append(f"{label}: {row['error']}")
            continue
        for error in row.get("failed_runs", []):
            lines.append(f"{label}: 1 of {len(row['runs'])} runs failed (left out): {error}")
        if row["timed_steps"] < document["steps"]:
            lines.append(
                f"{label}: only {row['timed_steps']} of {document['steps']} steps timed: the "
                "script ended sooner (more epochs, or fewer --steps)"
            )
    return list(dict.fromkeys(lines))  # a configuration in both tables is named once


def headline(document: Mapping[str, Any]) -> str:
    """The first line: what ran where, and how it was timed."""
    target = ("-m " if document["is_module"] else "") + document["target"]
    target = " ".join([target, *document["script_args"]])
    where = f"CPU ({document['cores']} cores)" if document["device"] == "cpu" else "GPUs"
    batch = document["samples_per_step"]
    return (
        f"bench scaling: {target} on {where}, torch {document['torch']}; {document['steps']} "
        f"timed optimizer steps after {document['warmup']} warm-up, {document['repeats']} "
        f"run(s) per configuration (medians); "
        + (f"global batch {batch} samples" if batch else "no ctx.loader batch recorded: steps/s")
    )


def _best_column(document: Mapping[str, Any]) -> list[str]:
    return ["best run"] if document["repeats"] > 1 else []


def _figures(row: Mapping[str, Any], document: Mapping[str, Any]) -> list[str]:
    spec = ".0f" if document["samples_per_step"] else ".2f"
    figures = [_fmt(row_throughput(row), spec)]
    if document["repeats"] > 1:
        figures.append(_fmt(row.get("best"), spec))
    return figures


def scaling_table(document: Mapping[str, Any]) -> Table:
    """World size, processes x threads, throughput, step time, speed-up, efficiency."""
    title = "Scaling: N processes x 1 thread" if document["device"] == "cpu" else "Scaling: N GPUs"
    table = Table(title=f"{title} (strong scaling, fixed global batch)", title_justify="left")
    columns = ["world size", "processes", _unit(document), *_best_column(document)]
    for column in (*columns, "step (ms)", "speed-up", "efficiency", "note"):
        table.add_column(column, justify="left" if column == "note" else "right")
    for row in document["scaling"]:
        efficiency = row["efficiency"]
        table.add_row(
            str(row["processes"]),
            _threads(row),
            *_figures(row, document),
            _fmt(row["step_ms"], ".2f"),
            _fmt(row["speedup"], ".2f"),
            "-" if efficiency is None else f"{efficiency:.0%}",
            _note(row, document),
        )
    return table


def splits_table(document: Mapping[str, Any]) -> Table:
    """Every processes x threads split of the cores, relative to 1 process x all cores."""
    table = Table(
        title=f"CPU splits of {document['cores']} cores: processes x threads", title_justify="left"
    )
    first = document["splits"][0] if document["splits"] else None
    base = f"vs {_threads(first)}" if first else "vs first"
    columns = ("split", _unit(document), *_best_column(document), "step (ms)", base, "note")
    for column in columns:
        table.add_column(column, justify="left" if column == "note" else "right")
    for row in document["splits"]:
        table.add_row(
            _threads(row),
            *_figures(row, document),
            _fmt(row["step_ms"], ".2f"),
            _fmt(row["speedup"], ".2f"),
            _note(row, document) or ("fastest" if _is_fastest(row, document) else ""),
        )
    return table


def recommendation_line(document: Mapping[str, Any]) -> str | None:
    """The line naming the fastest split and where it was saved (None when none was measured).

    Example:
        >>> recommendation_line({"recommendation": {"processes": 1, "threads": 2,
        ...     "throughput": 9000.0, "cache": None}, "samples_per_step": 64})
        'fastest split: 1 process(es) x 2 thread(s), 9000 samples/s'
    """
    rec = document.get("recommendation")
    if not rec:
        return None
    line = (
        f"fastest split: {rec['processes']} process(es) x {rec['threads']} thread(s), "
        f"{rec['throughput']:.0f} {_unit(document)}"
    )
    if rec.get("best_runs_favour"):
        rows = {_threads(r): r for r in document["splits"]}
        other = rows[rec["best_runs_favour"]]
        line += (
            f"; but the fastest single runs favour {rec['best_runs_favour']} "
            f"({other['best']:.0f} {_unit(document)}): other processes slowed the runs "
            "unevenly; rerun on an idle machine"
        )
    if rec["cache"]:
        line += (
            f"; saved to {rec['cache']}: `multigpu run --cpu auto` and `multigpu train --cpu "
            "auto` use it"
        )
    return line


def print_report(document: Mapping[str, Any], file: TextIO | None = None) -> None:
    """Print the headline, the scaling table, the split table and the recommendation."""
    load = document.get("load_before") if document["device"] == "cpu" else None
    console = report_console(headline(document), load, file)
    console.print(scaling_table(document))
    if document["splits"]:
        console.print(splits_table(document))
    for problem in problem_lines(document):
        console.print(problem, markup=False)
    if line := recommendation_line(document):
        console.print(line, markup=False)
    for name, path in document.get("files", {}).items():
        console.print(f"{name}: {path}", markup=False)


def write_files(document: Mapping[str, Any], out: Path) -> dict[str, str]:
    """Write ``scaling.csv``, ``scaling.png`` (with matplotlib) and ``scaling.json`` (the document
    with these ``files``) into ``out``; return the files, {kind: path}."""
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out / "scaling.json"), "csv": str(out / "scaling.csv")}
    with open(files["csv"], "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for table in ("scaling", "splits"):
            rows: Sequence[Mapping[str, Any]] = document[table]
            for row in rows:
                writer.writerow({"table": table, **row})
    if write_plot(document, out / "scaling.png"):
        files["png"] = str(out / "scaling.png")
    else:
        log.info("%s", NO_MATPLOTLIB)
    Path(files["json"]).write_text(json.dumps({**document, "files": files}, indent=2) + "\n")
    return files


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
        labels = [_threads(r) for r in splits]
        values = [float(row_throughput(r) or 0.0) for r in splits]
        colors = ["C2" if _is_fastest(r, document) else "C7" for r in splits]
        bars = axes[1].bar(labels, values, color=colors)
        axes[1].bar_label(bars, fmt="%.0f", fontsize=8)
        axes[1].margins(y=0.12)  # room for the labels above the tallest bar
        axes[1].set_xlabel("processes x threads")
        axes[1].set_ylabel(_unit(document))
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
