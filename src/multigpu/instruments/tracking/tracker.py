"""What every tracker adapter offers the dispatcher, and what it is told when its run opens.

An adapter keeps what ``ctx.log`` sends (``log``: no I/O, so a step costs microseconds) and
writes it all at once when the dispatcher calls ``flush`` (every few seconds, before a
checkpoint is saved, and when the run closes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from multigpu.instruments.tracking.run_file import Frontier


@dataclass(frozen=True, kw_only=True)
class Opening:
    """A run starting or continuing in ``directory`` at this job's first step."""

    directory: Path
    """The log directory (each tracker writes in its own place under it)."""
    name: str
    """The run's name (the directory's name)."""
    continuing: bool
    """True: an earlier job's run is continued (its ids are in ``ids``)."""
    first_step: int
    """The step of this job's first ``ctx.log``."""
    frontier: Frontier
    """What the run file says every tracker has (empty for a new run)."""
    ids: Mapping[str, str]
    """The trackers' ids of the run being continued."""
    config: Mapping[str, Any]
    """The run's hyperparameters (``init(config=)``)."""
    environment: Mapping[str, Any]
    """Where it runs: world size, nodes, strategy, precision, device, versions."""


class Logged(NamedTuple):
    """The values logged at one step, kept until the next flush."""

    step: int
    time: float
    """When the step's first values were logged (``time.time()``): the trackers' wall time."""
    values: dict[str, float]


class Tracker:
    """One tracker of a run: opened at the first ``ctx.log``, then sent each step's values."""

    name = ""

    def __init__(self) -> None:
        # Logged records whose values may still be GPU tensors (read by ``flush``).
        self._pending: list[tuple[int, float, dict[str, Any]]] = []

    def open(self, opening: Opening) -> Frontier | None:
        """Start or continue the run; return what the tracker's own store says it already has
        of a continued run when it can tell (it may hold a step the run file missed)."""
        raise NotImplementedError

    def ids(self) -> dict[str, str]:
        """The ids that name this tracker's run, kept in the run file."""
        return {}

    def where(self) -> str | None:
        """Where the run went, in a few words, when more than the log directory says it (an
        MLflow server, a W&B page); said once as the run opens."""
        return None

    def log(self, values: Mapping[str, Any], step: int, now: float) -> None:
        """Keep ``values`` (floats, or one-element GPU tensors) at ``step``, logged at wall time
        ``now``, for the next ``flush``."""
        pending = self._pending
        if pending and pending[-1][0] == step:  # a second call at the step: one record
            pending[-1][2].update(values)
        else:
            pending.append((step, now, dict(values)))

    def flush(self) -> None:
        """Write what was logged since the last flush, durably enough to survive this process
        being killed right after (kept, and written again by the next flush, if it fails)."""
        if self._pending:
            logged = [
                Logged(step, now, {k: float(v) for k, v in values.items()})  # waits for the GPU
                for step, now, values in self._pending
            ]
            self.write(logged)
            self._pending = []

    def write(self, logged: Sequence[Logged]) -> None:
        """Write ``logged`` (in step order) to the tracker's store."""
        raise NotImplementedError

    def close(self, failed: bool) -> None:
        """End the run (``failed``: the job ended by an error); ``flush`` was called first."""
