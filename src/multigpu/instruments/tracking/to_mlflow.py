"""The ``mlflow`` tracker: the tracking server ``MLFLOW_TRACKING_URI`` names, else a local store
in ``DIR/mlflow.db``.

With ``MLFLOW_TRACKING_URI`` set (``http://mlflow.team:5000``, ``databricks``, any URI MLflow
takes), the run goes there, as every MLflow client sends it: MLflow reads its own credentials
(``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``, ``MLFLOW_TRACKING_TOKEN``, its TLS
variables). Unset, a SQLite store in the run's directory (``sqlite:///DIR/mlflow.db``): MLflow 3
refuses its old ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE`` is set, and recommends SQLite
in its place; browse it with ``mlflow ui --backend-store-uri sqlite:///DIR/mlflow.db``. The run
file keeps the run's id and where it went, so a resumed job continues the same run on the same
server (and refuses, in one line, a job whose ``MLFLOW_TRACKING_URI`` names another one). The
hyperparameters are the run's params (immutable in MLflow: a continued run adds the new ones
only), the environment its tags (``multigpu.world_size``, ...). The experiment is
``MLFLOW_EXPERIMENT_NAME`` when set, else ``multigpu``.

An HTTP server is asked once, for at most ``REACH_TIMEOUT_S``, before the run opens: MLflow's
own client retries a refused connection for minutes (7 retries, backoff factor 2) before it
says why; this way a wrong URI or a server that is down is one line at once.

MLflow's store logs every database error with its traceback (``mlflow.store.db.utils``, through
the handler MLflow gives its own loggers) and then raises it: a full disk printed 330 lines
before the one that says it. Those records are dropped (``_Reraised``); the error still reaches
the dispatcher, which says it in one line.

Environment variables read: ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME`` (and whatever
``mlflow`` itself reads).
"""

from __future__ import annotations

import logging
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from multigpu.errors import UsageError
from multigpu.instruments.tracking.run_file import Frontier
from multigpu.instruments.tracking.tracker import Logged, Opening, Tracker

PARAM_LIMIT = 6000
"""MLflow's longest param value (characters)."""
BATCH_LIMIT = 1000
"""The most metrics MLflow takes in one ``log_batch``."""
REACH_TIMEOUT_S = 10.0
"""How long an HTTP tracking server has to answer before the run opens."""
URI_ID = "mlflow_tracking_uri"
"""The run file's id that says where the run went: ``MLFLOW_TRACKING_URI`` without
credentials, or "" for the store in the run's directory."""


class _Reraised(logging.Filter):
    """Drops the store's log records that carry the exception it raises next."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


_QUIET = _Reraised()


def store_uri(directory: Path) -> str:
    """The tracking URI of ``directory``'s store (for ``MlflowClient(tracking_uri=...)``)."""
    return "sqlite:///" + str((directory / "mlflow.db").absolute())


def server_uri(environ: Mapping[str, str] | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` (stripped), or "" when unset: the run's directory holds the store.

    Example:
        >>> server_uri({"MLFLOW_TRACKING_URI": " http://127.0.0.1:5000 "}), server_uri({})
        ('http://127.0.0.1:5000', '')
    """
    return (os.environ if environ is None else environ).get("MLFLOW_TRACKING_URI", "").strip()


def shown(uri: str) -> str:
    """``uri`` without the user and password it may hold (it is printed and kept in a file).

    Example:
        >>> shown("https://me:secret@mlflow.team:5000/x"), shown("databricks")
        ('https://mlflow.team:5000/x', 'databricks')
    """
    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def check_reachable(uri: str, timeout: float = REACH_TIMEOUT_S) -> None:
    """Raise a one-line UsageError when the HTTP(S) server ``uri`` names does not answer (any
    HTTP answer counts, 401 included: the credentials are MLflow's to send)."""
    if urllib.parse.urlsplit(uri).scheme not in ("http", "https"):
        return
    health = shown(uri).rstrip("/") + "/health"  # urllib takes no user:password@ in a URL
    try:
        with urllib.request.urlopen(health, timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except (OSError, ValueError) as e:  # refused, no such host, timed out, a malformed URI
        why = getattr(e, "reason", None) or e
        if isinstance(why, ssl.SSLError):
            return  # it answered in TLS: its certificate is MLflow's to check (its variables)
        raise UsageError(
            f"mlflow: MLFLOW_TRACKING_URI={shown(uri)} did not answer within {timeout:g} s "
            f"({why}); expected a running MLflow tracking server there: start it or correct "
            "the URI, or unset MLFLOW_TRACKING_URI to log into the run's directory (mlflow.db)"
        ) from e


class MlflowTracker(Tracker):
    """One MLflow run; each flush of the run is one ``log_batch`` (per 1000 values)."""

    name = "mlflow"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self._client: Any = None
        self._run_id = ""
        self._server = server_uri()

    def open(self, opening: Opening) -> Frontier | None:
        from mlflow import MlflowClient
        from mlflow.entities import RunTag

        store_log = logging.getLogger("mlflow.store.db.utils")
        if _QUIET not in store_log.filters:
            store_log.addFilter(_QUIET)
        run_id = opening.ids.get("mlflow") if opening.continuing else None
        if run_id:
            self._check_same_place(opening.ids.get(URI_ID, ""), run_id)
        if self._server:
            check_reachable(self._server)
        uri = self._server or store_uri(self.directory)
        client = self._client = MlflowClient(tracking_uri=uri)
        tags = [RunTag(f"multigpu.{k}", str(v)) for k, v in opening.environment.items()]
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

    def _check_same_place(self, went: str, run_id: str) -> None:
        """Refuse to continue run ``run_id``, which went to ``went``, anywhere else."""
        here = shown(self._server)
        if went.rstrip("/") == here.rstrip("/"):
            return
        place = {"": "the store in the run's directory (MLFLOW_TRACKING_URI unset)"}
        raise UsageError(
            f"mlflow: the run in {self.directory} (MLflow run {run_id}) is on "
            f"{place.get(went, went)}, and this job logs to {place.get(here, here)}; expected "
            "the same place to continue it: set MLFLOW_TRACKING_URI as the first job had it, "
            "or give another log directory for a new run"
        )

    def ids(self) -> dict[str, str]:
        return {"mlflow": self._run_id, URI_ID: shown(self._server)}

    def where(self) -> str:
        if not self._server:
            return f"mlflow: run {self._run_id} in {self.directory / 'mlflow.db'}"
        return f"mlflow: run {self._run_id} on {shown(self._server)} (MLFLOW_TRACKING_URI)"

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
