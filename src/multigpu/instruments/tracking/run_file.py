"""The run file of a tracker directory (``tracking.json``): which run it holds, what was sent.

Rewritten after each flush of the trackers (atomically: a killed process leaves the previous
one), so that a job resuming in the directory knows the trackers' ids and the last step they
all hold.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from multigpu.common.atomic_file import atomic_write
from multigpu.errors import UsageError

RUN_FILE = "tracking.json"
"""The run file's name in the log directory."""


@dataclass(frozen=True)
class Frontier:
    """What a tracker already has of its run: every key up to ``step``, and ``keys`` at it.

    Example:
        >>> f = Frontier(step=5, keys=frozenset({"loss"}))
        >>> f.has(4, "acc"), f.has(5, "loss"), f.has(5, "acc"), f.has(6, "loss")
        (True, True, False, False)
    """

    step: int | None = None
    """The last step sent (None: nothing yet)."""
    keys: frozenset[str] = frozenset()
    """The keys sent at ``step`` (a step can be logged in several calls)."""

    def has(self, step: int, key: str) -> bool:
        """True when ``key`` at ``step`` was sent already (it is not sent again)."""
        if self.step is None:
            return False
        return step < self.step or (step == self.step and key in self.keys)

    def after(self, step: int, keys: Mapping[str, object]) -> Frontier:
        """The frontier once ``keys`` were sent at ``step``."""
        if self.step is None or step > self.step:
            return Frontier(step, frozenset(keys))
        if step == self.step:
            return Frontier(step, self.keys | frozenset(keys))
        return self  # a lower step logged late: the frontier stays where it was


@dataclass
class TrackingRecord:
    """The contents of ``tracking.json``."""

    first_step: int
    """The first step the run logged (a job starting there again starts a new run)."""
    last_step: int | None = None
    """The last step sent to every tracker."""
    keys_at_last: list[str] = field(default_factory=list)
    """The keys sent at ``last_step``."""
    ids: dict[str, str] = field(default_factory=dict)
    """Each tracker's id of the run (mlflow's run id, wandb's run id)."""
    jobs: int = 1
    """How many jobs (first start, resumes, elastic restarts) logged into the run."""

    @property
    def frontier(self) -> Frontier:
        """What every tracker of the run has, as far as this file knows."""
        return Frontier(self.last_step, frozenset(self.keys_at_last))

    def note(self, frontier: Frontier) -> None:
        """Record that the trackers now hold everything up to ``frontier``."""
        self.last_step, self.keys_at_last = frontier.step, sorted(frontier.keys)


def read_run(directory: Path) -> TrackingRecord | None:
    """The run file of ``directory``, or None when there is none.

    Raises:
        UsageError: a run file that is not one (hand-edited, another program's).
    """
    path = directory / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = TrackingRecord(**data)
    except (ValueError, TypeError) as e:
        raise UsageError(
            f"{path} is not a multigpu tracking run file ({e}); expected the file multigpu "
            "writes; remove it to start a new run there, or give another log directory"
        ) from e
    return record


def write_run(directory: Path, record: TrackingRecord, *, durable: bool = False) -> None:
    """Replace the run file of ``directory`` by ``record`` (fsynced when ``durable``)."""
    text = json.dumps(asdict(record), indent=1) + "\n"
    atomic_write(directory / RUN_FILE, lambda fh: fh.write(text.encode()), durable=durable)


def plain(value: Any) -> str | int | float | bool:
    """``value`` as a tracker takes a hyperparameter: a number, a bool or a string.

    Example:
        >>> plain(3), plain(None), plain((1, 2))
        (3, 'None', '(1, 2)')
    """
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
