"""``--log-to mlflow`` with ``MLFLOW_TRACKING_URI``: a real ``mlflow server`` started here (on
127.0.0.1, a free port, its store in a temporary folder) gets one run with every step once, also
after a resume; a resume pointed elsewhere, and a server that does not answer, are one line.

The server runs without its job runner (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: four huey
consumers a run does not use), in a session of its own killed as a group at the end; the kernel
sends it SIGTERM if this process dies first (``PR_SET_PDEATHSIG``), which it forwards to uvicorn.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import multigpu
from multigpu.errors import UsageError
from multigpu.testing.distributed import free_port
from tests.launch._util import child_env, run_multigpu

pytestmark = pytest.mark.requires("module:mlflow")

STEPS = list(range(1, 11))  # 2 epochs of the digits job in batches of 256: 5 steps each
UP_WITHIN_S = 60.0


def _term_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URI of an ``mlflow server`` on 127.0.0.1 (stopped at the end of the module)."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    argv = [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{tmp / 'store.db'}",
            "--default-artifact-root", str(tmp / "artifacts")]  # fmt: skip
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        argv, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=child_env({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}),
        preexec_fn=_term_with_parent,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + UP_WITHIN_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited {proc.returncode}: {_tail(tmp)}")
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not up within {UP_WITHIN_S:g} s: {_tail(tmp)}")
            time.sleep(0.25)
        yield uri
    finally:
        _stop(proc)
        log.close()


def _tail(tmp: Path) -> str:
    return (tmp / "server.log").read_text()[-2000:]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its own pid: a session of its own), then KILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        try:  # the CLI is gone; uvicorn may still be stopping
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    proc.wait(timeout=5)


def _runs(uri: str, experiment: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment} on {uri}"
    return client.search_runs([found.experiment_id], max_results=10)


def test_train_puts_one_run_with_each_step_once_on_the_server_after_a_resume(
    tmp_path: Path, server: str
) -> None:
    from mlflow import MlflowClient

    out = tmp_path / "out"
    common = ["--cpu", "1", "--progress", "off", "--out", str(out), "--batch-size", "256",
              "--checkpoint-every", "4", "--log-to", "mlflow"]  # fmt: skip
    env = {"MLFLOW_TRACKING_URI": server, "MLFLOW_EXPERIMENT_NAME": "train-resume"}
    said = []
    for epochs in ("1", "2"):  # the second job resumes from the checkpoint of step 4
        done = run_multigpu(["train", "--epochs", epochs, *common], tmp_path, timeout=180, **env)
        assert done.returncode == 0, done.stderr
        said.append(next(ln for ln in done.stdout.splitlines() if ln.startswith("tracking:")))
    (run,) = _runs(server, "train-resume")
    run_id = run.info.run_id
    assert said[0].endswith(f"(a new run; mlflow: run {run_id} on {server} (MLFLOW_TRACKING_URI))")
    assert "continuing its run; steps up to 5 are there" in said[1] and run_id in said[1]
    client = MlflowClient(tracking_uri=server)
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == STEPS
    assert [m.step for m in client.get_metric_history(run_id, "test_accuracy")] == [5, 10]
    assert run.info.status == "FINISHED"
    assert run.data.tags["multigpu.world_size"] == "1"
    assert not (out / "mlflow.db").exists()  # nothing local: the server holds the run
    ids = json.loads((out / "tracking.json").read_text())["ids"]
    assert ids == {"mlflow": run_id, "mlflow_tracking_uri": server}


def test_a_resume_that_logs_elsewhere_is_refused(
    tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "elsewhere")
    with multigpu.init(environ={}, log_to="mlflow", log_dir=tmp_path) as ctx:
        for step in (1, 2, 3):
            ctx.log({"loss": 1.0 / step}, step=step)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # the resume would log to tmp_path/mlflow.db
    with (
        pytest.raises(UsageError, match=f"is on {server}, and this job logs to the store in"),
        multigpu.init(environ={}, log_to="mlflow", log_dir=tmp_path) as ctx,
    ):
        ctx.log({"loss": 0.2}, step=3)
    (run,) = _runs(server, "elsewhere")
    assert run.info.status == "FINISHED"
    assert not (tmp_path / "mlflow.db").exists()


def test_a_server_that_does_not_answer_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:secret@127.0.0.1:{port}")
    began = time.monotonic()
    with (
        pytest.raises(UsageError) as raised,
        multigpu.init(environ={}, log_to="mlflow", log_dir=tmp_path) as ctx,
    ):
        ctx.log({"loss": 1.0}, step=1)
    said = str(raised.value)
    assert said.startswith(f"mlflow: MLFLOW_TRACKING_URI=http://127.0.0.1:{port} did not answer")
    assert "secret" not in said and "\n" not in said
    assert time.monotonic() - began < 10
