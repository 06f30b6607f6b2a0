"""What ``multigpu doctor`` prints: a rich table, or one JSON document with ``--json``.

The JSON document::

    {"host": "vm", "mode": "single" | "ranks", "world_size": 1,
     "checks": [{"group", "name", "status", "value", "fix", "where", "detail"}, ...],
     "summary": {"OK": n, "WARN": n, "FAIL": n, "SKIP": n}, "exit_code": 0 | 1,
     "ranks": [{"rank", "host", "versions", "iface", "mtu"}, ...]}   (multi-rank mode only)
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from multigpu.diagnostics.doctor.checks import Check, exit_code, summary

STYLES = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}
"""The colour of each status in the table (plain text when the output is not a terminal)."""


def document(
    checks: Sequence[Check],
    *,
    host: str,
    mode: str = "single",
    world_size: int = 1,
    ranks: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The JSON document of a doctor run (see the module docstring for its keys)."""
    doc: dict[str, Any] = {
        "host": host,
        "mode": mode,
        "world_size": world_size,
        "checks": [check.as_dict() for check in checks],
        "summary": summary(checks),
        "exit_code": exit_code(checks),
    }
    if ranks:
        doc["ranks"] = [dict(rank) for rank in ranks]
    return doc


def print_table(doc: Mapping[str, Any], file: TextIO | None = None) -> None:
    """Print the document as a table: group, check, status, what was found, the fix."""
    console = Console(
        file=file or sys.stdout,
        width=max(120, shutil.get_terminal_size().columns),
        highlight=False,
    )
    where = f"{doc['world_size']} ranks" if doc["mode"] == "ranks" else "this machine"
    table = Table(title=f"multigpu doctor: {doc['host']} ({where})", title_justify="left")
    for column in ("group", "check", "status", "found", "fix"):
        table.add_column(column, overflow="fold")
    previous = None
    for row in doc["checks"]:
        name = f"{row['where']}: {row['name']}" if row["where"] else row["name"]
        table.add_row(
            "" if row["group"] == previous else row["group"],
            Text(name),
            Text(row["status"], style=STYLES[row["status"]]),
            Text(row["value"]),
            Text(row["fix"]),
        )
        previous = row["group"]
    console.print(table)
    counts = ", ".join(f"{n} {status}" for status, n in doc["summary"].items())
    verdict = "FAIL: see the fixes above" if doc["exit_code"] else "no FAIL"
    console.print(f"{counts} ({verdict})", markup=False)


def print_json(doc: Mapping[str, Any], file: TextIO | None = None) -> None:
    """Print the document as indented JSON, one document on stdout."""
    (file or sys.stdout).write(json.dumps(doc, indent=2) + "\n")
