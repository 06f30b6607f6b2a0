"""The rows of ``multigpu doctor``: ``Check`` (one finding), its statuses, counts, exit code,
and what the doctor prints: a rich table, or one JSON document with ``--json``.

- ``OK``: looked at it, it is fine;
- ``WARN``: it works, but it will be slow or break in some setups (the fix says what to do);
- ``FAIL``: distributed training will not work as things are (the fix says what to do);
- ``SKIP``: not applicable here (no GPU, a CPU-only torch, ``--no-probe``): the value says why.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

Status = Literal["OK", "WARN", "FAIL", "SKIP"]
STATUSES: tuple[Status, ...] = ("OK", "WARN", "FAIL", "SKIP")
"""Every status, in the order the summary counts them."""


def one_line(text: object) -> str:
    """``text`` as one line: whitespace runs (newlines included) become one space."""
    return " ".join(str(text).split())


@dataclass(frozen=True, kw_only=True)
class Check:
    """One row of the doctor's table. Build it with ``ok``, ``warn``, ``fail`` or ``skip``."""

    group: str
    """What it is about: ``software``, ``cuda``, ``gpu``, ``cpu``, ``network``, ``launch``,
    ``process group`` or ``ranks``."""
    name: str
    """The thing checked, e.g. ``torch``, ``/dev/shm``, ``eth0``."""
    status: Status
    value: str
    """What was found, on one line (for SKIP: why it does not apply)."""
    fix: str = ""
    """For WARN and FAIL: what to do about it, one concrete line; empty for OK and SKIP."""
    where: str = ""
    """The rank and host the row comes from when it is another rank's (``rank 1 (node1)``)."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """More for the JSON document (a topology matrix, bandwidth per size); not in the table."""

    def __post_init__(self) -> None:
        # Built by our own code only: these guard the table's promise, not user input.
        if self.status not in STATUSES:
            raise ValueError(f"Check status {self.status!r}; expected one of {STATUSES}")
        if self.status in ("WARN", "FAIL") and not self.fix:
            raise ValueError(f"Check {self.name!r} is {self.status} without a fix")
        if not self.value:
            raise ValueError(f"Check {self.name!r} has no value (for SKIP: the reason)")

    def as_dict(self) -> dict[str, Any]:
        """The row as the JSON document holds it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Check:
        """The row back from ``as_dict`` (another rank's rows arrive this way). Keys this
        version does not know are dropped: a rank running another multigpu must still report."""
        known = {f.name for f in fields(cls)} - {"detail"}
        return cls(
            **{k: v for k, v in data.items() if k in known}, detail=dict(data.get("detail") or {})
        )


def _make(
    status: Status, group: str, name: str, value: object, fix: object = "", **detail: Any
) -> Check:
    return Check(
        group=group,
        name=name,
        status=status,
        value=one_line(value),
        fix=one_line(fix),
        detail=detail,
    )


def ok(group: str, name: str, value: object, **detail: Any) -> Check:
    """An OK row."""
    return _make("OK", group, name, value, **detail)


def warn(group: str, name: str, value: object, fix: object, **detail: Any) -> Check:
    """A WARN row: it works but will be slow or fragile; ``fix`` says what to do."""
    return _make("WARN", group, name, value, fix, **detail)


def fail(group: str, name: str, value: object, fix: object, **detail: Any) -> Check:
    """A FAIL row: distributed training will not work like this; ``fix`` says what to do."""
    return _make("FAIL", group, name, value, fix, **detail)


def skip(group: str, name: str, reason: object, **detail: Any) -> Check:
    """A SKIP row: the check does not apply here; ``reason`` says why."""
    return _make("SKIP", group, name, reason, **detail)


def summary(checks: Iterable[Check]) -> dict[str, int]:
    """How many rows have each status (every status present, 0 when none).

    Example:
        >>> summary([ok("a", "b", "c"), skip("a", "d", "e")])
        {'OK': 1, 'WARN': 0, 'FAIL': 0, 'SKIP': 1}
    """
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for check in checks:
        counts[check.status] += 1
    return counts


def exit_code(checks: Iterable[Check]) -> int:
    """1 when any row FAILs, else 0 (WARN and SKIP do not fail the command)."""
    return 1 if any(check.status == "FAIL" for check in checks) else 0


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
