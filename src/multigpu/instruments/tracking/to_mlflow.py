"""The ``mlflow`` tracker: a local store in ``DIR/mlflow.db``, never a server.

A SQLite store (``sqlite:///DIR/mlflow.db``): MLflow 3 refuses its old ``file:`` store unless
``MLFLOW_ALLOW_FILE_STORE`` is set, and recommends SQLite in its place. The hyperparameters are
the run's params (immutable in MLflow: a continued run adds the new ones only), the environment
its tags (``multigpu.world_size``, ...). Browse it with ``mlflow ui --backend-store-uri
sqlite:///DIR/mlflow.db``. The experiment is ``MLFLOW_EXPERIMENT_NAME`` when set, else
``multigpu``.

MLflow's store logs every database error with its traceback (``mlflow.store.db.utils``, through
the handler MLflow gives its own loggers) and then raises it: a full disk printed 330 lines
before the one that says it. Those records are dropped (``_Reraised``); the error still reaches
the dispatcher, which says it in one line.

Environment variables read: ``MLFLOW_EXPERIMENT_NAME``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from multigpu.instruments.tracking.run_file import Frontier
from multigpu.instruments.tracking.tracker import Logged, Opening, Tracker

PARAM_LIMIT = 6000
"""MLflow's longest param value (characters)."""
BATCH_LIMIT = 1000
"""The most metrics MLflow takes in one ``log_batch``."""


class _Reraised(logging.Filter):
    """Drops the store's log records that carry the exception it raises next."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


_QUIET = _Reraised()


def store_uri(directory: Path) -> str:
    """The tracking URI of ``directory``'s store (for ``MlflowClient(tracking_uri=...)``)."""
    return "sqlite:///" + str((directory / "mlflow.db").absolute())


class MlflowTracker(Tracker):
    """One MLflow run; each flush of the run is one ``log_batch`` (per 1000 values)."""

    name = "mlflow"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self._client: Any = None
        self._run_id = ""

    def open(self, opening: Opening) -> Frontier | None:
        from mlflow import MlflowClient
        from mlflow.entities import RunTag

        store_log = logging.getLogger("mlflow.store.db.utils")
        if _QUIET not in store_log.filters:
            store_log.addFilter(_QUIET)
        client = self._client = MlflowClient(tracking_uri=store_uri(self.directory))
        tags = [RunTag(f"multigpu.{k}", str(v)) for k, v in opening.environment.items()]
        run_id = opening.ids.get("mlflow") if opening.continuing else None
        if run_id:
            self._run_id = run_id
            run = client.get_run(run_id)
            client.update_run(run_id, status="RUNNING")
            have = run.data.params
            fresh = {k: v for k, v in opening.config.items() if k not in have}
            client.log_batch(run_id, params=_params(fresh), tags=tags)
            # A step logged just before the process was killed is in the store, not the file.
            found = run.data._metric_objs  # the latest value of each key, with its step
            last = max((m.step for m in found), default=None)
            return Frontier(last, frozenset(m.key for m in found if m.step == last))
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "multigpu"
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        run = client.create_run(experiment_id, run_name=opening.name)
        self._run_id = run.info.run_id
        client.log_batch(self._run_id, params=_params(opening.config), tags=tags)
        return None

    def ids(self) -> dict[str, str]:
        return {"mlflow": self._run_id}

    def write(self, logged: Sequence[Logged]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(key, value, int(walltime * 1000), step)
            for step, walltime, values in logged
            for key, value in values.items()
        ]
        for start in range(0, len(metrics), BATCH_LIMIT):  # in step order: a prefix if killed
            self._client.log_batch(self._run_id, metrics=metrics[start : start + BATCH_LIMIT])

    def close(self, failed: bool) -> None:
        if self._client is not None:
            self._client.set_terminated(self._run_id, status="FAILED" if failed else "FINISHED")
            self._client = None


def _params(config: Mapping[str, Any]) -> list[Any]:
    from mlflow.entities import Param

    return [Param(k, str(v)[:PARAM_LIMIT]) for k, v in config.items()]
