"""The ``csv`` tracker: ``metrics.csv`` in long form (``step,key,value``) and ``params.json``.

Long form needs no header that grows as keys appear: one row per value, appended (and handed
to the OS) at each flush of the run; ``pandas.read_csv(path).pivot(index="step", columns="key",
values="value")`` gives the wide table. Needs nothing beyond the standard library.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from multigpu.common.atomic_file import atomic_write
from multigpu.instruments.tracking.run_file import Frontier
from multigpu.instruments.tracking.tracker import Logged, Opening, Tracker

HEADER = ("step", "key", "value")


class CsvTracker(Tracker):
    """``DIR/metrics.csv`` and ``DIR/params.json`` (hyperparameters and environment)."""

    name = "csv"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.path = directory / "metrics.csv"
        self.params = directory / "params.json"
        self._fh: TextIO | None = None

    def open(self, opening: Opening) -> Frontier | None:
        kept = _rows_within(self.path, opening.frontier) if opening.continuing else []
        # A new run starts the file afresh; a continued one keeps the rows the run file
        # vouches for (a row written just before the process was killed is sent again).
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([HEADER, *kept])
        atomic_write(self.path, lambda fh: fh.write(text.getvalue().encode()))
        params = {"config": dict(opening.config), "environment": dict(opening.environment)}
        body = json.dumps(params, indent=1, default=str) + "\n"
        atomic_write(self.params, lambda fh: fh.write(body.encode()))
        self._fh = self.path.open("a", encoding="utf-8", newline="")
        return None

    def write(self, logged: Sequence[Logged]) -> None:
        if self._fh is None:
            return
        csv.writer(self._fh, lineterminator="\n").writerows(
            (step, key, repr(value)) for step, _, values in logged for key, value in values.items()
        )
        self._fh.flush()  # in the OS's hands: a process killed from here on loses none of it

    def close(self, failed: bool) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _rows_within(path: Path, frontier: Frontier) -> list[list[str]]:
    """The rows of ``path`` that ``frontier`` covers (a torn last line is dropped)."""
    if not path.is_file():
        return []
    kept: list[list[str]] = []
    with path.open(encoding="utf-8", newline="") as fh:
        for row in csv.reader(fh):
            if len(row) != 3 or row[0] == "step":
                continue
            try:
                step, _ = int(row[0]), float(row[2])
            except ValueError:
                continue
            if frontier.has(step, row[1]):
                kept.append(row)
    return kept
