"""Experiment trackers: ``multigpu.init(log_to=...)`` and ``ctx.log(metrics, step=)``.

Rank 0 alone logs, so a job is one run in each tracker whatever its processes and nodes. The
run lives in one directory (``log_dir``) beside a small run file (``tracking.json``) that names
it and says the last step sent; a job that resumes there (from a checkpoint, or an elastic
restart) continues the same run and does not send again a step its trackers already have.
One module per tracker (``to_tensorboard``, ``to_csv``, ``to_mlflow``, ``to_wandb``), each
importing its package only when a run opens; ``dispatch`` is the hook the Context calls.
The names and the check of a ``log_to`` value are in ``multigpu.common.tracker_names`` (no torch).
"""

from __future__ import annotations

from multigpu.instruments.tracking.dispatch import DEFAULT_LOG_DIR, LogCheck, Tracking

__all__ = ["DEFAULT_LOG_DIR", "LogCheck", "Tracking"]
