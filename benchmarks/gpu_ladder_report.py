"""The GPU ladder's output: a row's line, the markdown table of a run, and the files (the JSON
list of runs each ladder joins, the latest table), each written whole.

Environment variables read: none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def line(row: dict[str, Any]) -> str:
    """The line a rung prints when it ends."""
    if "tokens_per_s" not in row:
        return f"{row['label']}: {row['status']}"
    return (
        f"{row['label']}: {row['tokens_per_s']:,.0f} tokens/s, step {1e3 * row['step_s']:.1f} ms, "
        f"first step {row['first_step_s']:.1f} s, rung {row['rung_s']:.1f} s"
    )


def table(record: dict[str, Any]) -> str:
    """The run's markdown table, headed by what ran where and when."""
    rows = record["rows"]
    eager = next((r for r in rows if r["rung"] == "eager" and "tokens_per_s" in r), None)
    head = (
        f"{record['device']}, {record['world_size']} rank(s), torch {record['torch']}, "
        f"{record['model']} ({record['parameters'] / 1e6:.2f}M parameters, sequence "
        f"{record['config']['seq_len']}, global batch {record['global_batch']}), "
        f"{record['precision']}, compile backend {record['compile_backend']}; "
        f"{record['date']}: `{record['command']}`"
    )
    lines = [
        head,
        "",
        "| rung | tokens/s | vs eager | step ms | peak memory | MFU | first step s | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "tokens_per_s" not in r:
            lines.append(f"| {r['label']} | | | | | | | {r['status']} |")
            continue
        ratio = f"{r['tokens_per_s'] / eager['tokens_per_s']:.2f}x" if eager else "n/a"
        memory = f"{r['peak_memory_bytes'] / 2**20:,.0f} MiB"
        if r["peak_memory_of"] != "cuda max_memory_allocated":
            memory += " (RSS)"
        share = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %"
        note = "" if r["status"] == "ok" else r["status"]
        lines.append(
            f"| {r['label']} | {r['tokens_per_s']:,.0f} | {ratio} | {1e3 * r['step_s']:.1f} | "
            f"{memory} | {share} | {r['first_step_s']:.1f} | {note} |"
        )
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> None:
    """Write ``text`` whole: to a temporary file, then renamed over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def save(record: dict[str, Any], earlier: list[Any], out: Path, table_path: Path) -> None:
    """The JSON list ``earlier`` with this run appended, and the run's table."""
    write(out, json.dumps([*earlier, record], indent=1) + "\n")
    write(table_path, table(record))


def earlier_runs(path: Path) -> list[Any] | None:
    """The runs ``path`` holds ([] when there is no such file), or None when it holds something
    else than a JSON list."""
    if not path.exists():
        return []
    try:
        runs = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return runs if isinstance(runs, list) else None
