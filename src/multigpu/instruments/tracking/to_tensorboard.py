"""The ``tensorboard`` tracker: one event-file run in ``DIR/tensorboard``.

Uses ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package). The
hyperparameters go into the same run (the HPARAMS tab; ``add_hparams`` would make a run of its
own), the environment into a text summary. A continued run reopens the directory with
``purge_step`` one past the last step sent, so an event written after the run file's last
update (a process killed in between) is hidden by TensorBoard and sent again: no step twice.
The scalars are added to the writer, and the writer flushed, at each flush of the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from multigpu.instruments.tracking.run_file import Frontier
from multigpu.instruments.tracking.tracker import Logged, Opening, Tracker


class TensorBoardTracker(Tracker):
    """``SummaryWriter(DIR/tensorboard)``, flushed at each flush of the run."""

    name = "tensorboard"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.path = directory / "tensorboard"
        self._writer: Any = None

    def open(self, opening: Opening) -> Frontier | None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        last = opening.frontier.step
        if opening.continuing:
            purge = None if last is None else last + 1
        else:  # a new run over an old one in the same directory: hide the old from here on
            purge = opening.first_step if self.path.is_dir() else None
        self._writer = SummaryWriter(log_dir=str(self.path), purge_step=purge)
        if not opening.continuing:
            writer = self._writer.file_writer
            for summary in hparams(dict(opening.config) or {"none": "none"}, {}):
                writer.add_summary(summary)
            self._writer.add_text("environment", _table(opening.environment), opening.first_step)
            self._writer.add_text("config", _table(opening.config), opening.first_step)
            self._writer.flush()
        return None

    def write(self, logged: Sequence[Logged]) -> None:
        for step, walltime, values in logged:
            for key, value in values.items():
                self._writer.add_scalar(key, value, step, walltime=walltime)
        self._writer.flush()

    def close(self, failed: bool) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _table(values: Mapping[str, Any]) -> str:
    """A Markdown table (TensorBoard's text tab renders it)."""
    rows = "".join(f"| {k} | {v} |\n" for k, v in values.items())
    return "| name | value |\n|---|---|\n" + rows
