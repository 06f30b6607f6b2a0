"""The ``wandb`` tracker: one Weights & Biases run, resumed by its id.

W&B's own settings decide where it goes, as for any W&B script: online by default (to
``WANDB_BASE_URL``, a team's W&B server, else wandb.ai; ``WANDB_API_KEY`` or ``wandb login``),
``WANDB_MODE=offline`` keeps it on disk for a later ``wandb sync``; ``WANDB_ENTITY``,
``WANDB_PROJECT`` (else project ``multigpu``), ``WANDB_NAME`` (else the log directory's name),
``WANDB_RUN_ID`` (a new run's id), ``WANDB_DIR`` (else files go to ``DIR/wandb``), ``WANDB_TAGS``
... are W&B's to read: only what they leave unset is passed to ``wandb.init``, since an argument
there overrides its variable. The line that opens the run says its page (online) or its folder.
A continued run is ``wandb.init(id=<the run's id>, resume="allow")``; W&B rejects a step lower
than its current one, so the steps the run already has are not sent again. Offline, each job
of the run is a directory of its own (``offline-run-*-<id>``) that ``wandb sync`` merges.

``wandb.init`` replaces ``sys.excepthook`` (its own prints every uncaught exception's traceback,
then calls the one before) and ``sys.exit``, and never puts them back: a Ctrl-C ended in 59 lines
and a traceback ending in ``worker_exit._on_sigint`` where the worker's hook says one line. They
are put back as they were (the run's exit code is given to ``finish``), and a run that ends by an
error or Ctrl-C finishes without W&B's summary panel (its 20 lines would follow the error's one).

Environment variables read: ``WANDB_PROJECT``, ``WANDB_NAME``, ``WANDB_DIR`` (whether set; and
whatever ``wandb`` itself reads).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from multigpu.instruments.tracking.run_file import Frontier
from multigpu.instruments.tracking.tracker import Logged, Opening, Tracker


class WandbTracker(Tracker):
    """``wandb.init(dir=DIR, id=..., resume="allow")`` on rank 0."""

    name = "wandb"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self._run: Any = None

    def open(self, opening: Opening) -> Frontier | None:
        import wandb

        run_id = opening.ids.get("wandb") if opening.continuing else None
        config = {**opening.config, "multigpu": dict(opening.environment)}
        self.directory.mkdir(parents=True, exist_ok=True)
        # W&B's variables win: an argument given to wandb.init would override its variable.
        env = os.environ
        hook, leave = sys.excepthook, sys.exit
        try:
            self._run = wandb.init(
                project=None if env.get("WANDB_PROJECT") else "multigpu",
                dir=None if env.get("WANDB_DIR") else str(self.directory),
                id=run_id,  # None: WANDB_RUN_ID, else wandb makes one (kept in the run file)
                name=None if env.get("WANDB_NAME") else opening.name,
                resume="allow",
                config=config,
                # The launcher owns this process's output: no console capture.
                settings=wandb.Settings(console="off"),
            )
        finally:  # the process's ending stays multigpu's (module doc)
            sys.excepthook, sys.exit = hook, leave
        if run_id:
            self._run.config.update(config, allow_val_change=True)
        return None

    def ids(self) -> dict[str, str]:
        return {"wandb": str(self._run.id)}

    def where(self) -> str:
        run = self._run
        if run.settings._offline:
            return f"wandb: run {run.id} offline in {run.settings.sync_dir} (wandb sync uploads it)"
        return f"wandb: run {run.id} at {run.url}"

    def write(self, logged: Sequence[Logged]) -> None:
        for step, walltime, values in logged:  # W&B's service process writes them
            self._run.log({**values, "_timestamp": walltime}, step=step)

    def close(self, failed: bool) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            if not failed:
                run.finish(exit_code=0)
                return
            # W&B prints its panel to stderr as it finishes; after an error, only the error.
            with (
                open(os.devnull, "w") as quiet,
                contextlib.redirect_stderr(quiet),
                contextlib.redirect_stdout(quiet),
            ):
                run.finish(exit_code=1)
