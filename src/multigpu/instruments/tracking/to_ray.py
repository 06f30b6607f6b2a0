"""The ``ray`` tracker: ``ctx.log`` reported through ``ray.train.report``, in a Ray Train worker.

Not a rank-0 adapter like the others (``dispatch.Tracking``): Ray's report is a barrier of every
worker of the run, each of which must report as many times as the others, and each report after
the first waits until Ray's controller has collected the one before (it polls every 2 s,
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``). A report at every ``ctx.log`` made a 60-step run on 2
CPU workers take 135 s instead of 17 s. So every rank reports at the points where every rank is
anyway, and Ray's own idiom reports: before each checkpoint is saved (a ``Checkpointer``'s or
``ctx.save``'s) and when the ``with`` block ends without an error. A report holds the values
logged since the one before (the latest of each name) and ``step``, the last step logged (a save
in ``ckpt.step()`` comes before the loop logs that step: its report carries the steps before); a
rank that logged nothing reports ``{}``, so the counts agree however the loop logs. Ray keeps
rank 0's metrics with a checkpoint reported beside them, and gives every worker's to a
``ray.train.UserCallback``'s ``after_report``.

Environment variables read: none (``ray`` reads its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multigpu.errors import UsageError
from multigpu.instruments.hooks import Hook
from multigpu.instruments.tracking.dispatch import numbers_of


def check_ray_worker(source: str) -> None:
    """Refuse ``log_to="ray"`` outside a Ray Train worker (``source``: the job's launcher), in
    one line: ``ray.train.report`` has no run to report to there.

    Example:
        >>> check_ray_worker("ray")
        >>> try:
        ...     check_ray_worker("torchrun")
        ... except UsageError as e:
        ...     print(str(e).split(";")[0])
        log_to='ray' reports through ray.train.report, but this process was started by torchrun, not as a Ray Train worker
    """  # noqa: E501
    if source != "ray":
        raise UsageError(
            f"log_to='ray' reports through ray.train.report, but this process was started by "
            f"{source}, not as a Ray Train worker; expected multigpu.init(log_to='ray') in the "
            "training function of ray.train.torch.TorchTrainer: run the loop there, or leave ray "
            "out of log_to / --log-to / MULTIGPU_LOG_TO"
        )


class RayReport(Hook):
    """Every rank's ``ctx.log`` values, one ``ray.train.report`` before each checkpoint save and
    at the block's end (see the module doc)."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._step: int | None = None

    def on_log(self, ctx: Any, metrics: Mapping[str, Any], step: int) -> float | None:
        self._values.update(numbers_of(metrics, step))  # refused alike on every rank
        self._step = step
        return None

    def on_save(self, ctx: Any) -> None:
        self._report()

    def on_exit(self, ctx: Any, error: BaseException | None) -> None:
        # After an error another worker may be gone: its barrier would wait for Ray's restart.
        if error is None or (isinstance(error, SystemExit) and not error.code):
            self._report()

    def _report(self) -> None:
        from ray.train import report

        metrics = {k: float(v) for k, v in self._values.items()}  # a GPU value: read once here
        if self._step is not None:
            metrics = {"step": self._step, **metrics}
        self._values, self._step = {}, None
        report(metrics)
