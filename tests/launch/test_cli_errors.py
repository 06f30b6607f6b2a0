"""Every bad input to ``python -m multigpu``: exit code 2, one line on stderr, nothing started.

The children run concurrently (each one mostly waits for ``import torch``) to keep this fast.
A ``sitecustomize`` on their path leaves a file in the working directory from any process
torchrun's agent starts: a worker that started is seen even if it said nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest

from tests.launch._util import SRC, popen_multigpu

WORKER_MARK = """
import os
if os.environ.get("TORCHELASTIC_RUN_ID") and "LOCAL_RANK" in os.environ:
    open(f"worker-started-{os.getpid()}", "w").close()
"""

CASES: dict[str, list[str]] = {
    "too-many-gpus": ["run", "--gpus", "3", "s.py"],
    "same-gpu-twice": ["run", "--gpus", "0,0", "s.py"],
    "cpu-zero": ["run", "--cpu", "0", "s.py"],
    "cpu-negative": ["run", "--cpu", "-1", "s.py"],
    "cpu-not-a-number": ["run", "--cpu", "x", "s.py"],
    "cpu-and-gpus": ["run", "--cpu", "2", "--gpus", "1", "s.py"],
    "missing-script": ["run", "--cpu", "2", "missing.py"],
    "script-is-a-directory": ["run", "--cpu", "2", "."],
    "no-script": ["run", "--cpu", "2"],
    "nccl-on-cpu": ["run", "--cpu", "2", "--backend", "nccl", "s.py"],  # GPUs or not
    "nproc-contradicts-cpu": ["run", "--cpu", "2", "--nproc-per-node", "3", "s.py"],
    "master-port-in-use": ["run", "--cpu", "2", "--master-port", "{port}", "s.py"],
    "endpoint-in-use": ["run", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:{port}", "s.py"],
    "unknown-subcommand": ["frobnicate", "s.py"],
    "iface-missing": ["run", "--cpu", "2", "--iface", "nope", "s.py"],
    "timeout-not-seconds": ["run", "--timeout", "0", "s.py"],
    "train-iface-missing": ["train", "--iface", "nope", "--epochs", "1"],
    "train-cpu-zero": ["train", "--cpu", "0", "--epochs", "1"],
    "train-batch-not-divisible": ["train", "--cpu", "2", "--batch-size", "63", "--out", "out"],
    "train-epochs-zero": ["train", "--cpu", "2", "--epochs", "0"],
    "train-abbreviation": ["train", "--cpu", "2", "--epoch", "1"],
    "train-out-is-a-file": ["train", "--cpu", "2", "--epochs", "1", "--out", "s.py"],
    "run-env-strategy": ["run", "--cpu", "2", "s.py"],
    "run-env-backend": ["run", "--cpu", "2", "s.py"],
    "train-env-device": ["train", "--cpu", "2", "--epochs", "1"],
    "train-env-deterministic": ["train", "--cpu", "2", "--epochs", "1"],
    "run-env-log-level": ["run", "--cpu", "2", "s.py"],
    "max-restarts-negative": ["run", "--cpu", "2", "--max-restarts", "-1", "s.py"],
    "monitor-interval-negative": ["run", "--cpu", "2", "--monitor-interval", "-1", "s.py"],
    "lm-pipeline-bf16": ["train", "--model", "lm", "--cpu", "2", "--strategy", "pipeline",
                         "--precision", "bf16-mixed"],
    "lm-pipeline-accumulation": ["train", "--model", "lm", "--cpu", "2", "--strategy",
                                 "pipeline", "--accumulation-steps", "2"],
}  # fmt: skip

ENV = {
    "run-env-strategy": {"MULTIGPU_STRATEGY": "bogus"},
    "run-env-backend": {"MULTIGPU_BACKEND": "mpi"},
    "train-env-device": {"MULTIGPU_DEVICE": "tpu"},
    "train-env-deterministic": {"MULTIGPU_DETERMINISTIC": "maybe"},
    "run-env-log-level": {"MULTIGPU_LOG_LEVEL": "loud"},
}

EXPECTED = {
    "too-many-gpus": "--gpus 3",
    "same-gpu-twice": "0,0",
    "cpu-zero": "--cpu 0",
    "cpu-negative": "--cpu -1",
    "cpu-not-a-number": "--cpu x",
    "cpu-and-gpus": "together",
    "missing-script": "missing.py",
    "script-is-a-directory": "'.' is a directory",
    "no-script": "was given no script",
    "nccl-on-cpu": "--backend nccl was asked for on --cpu 2",
    "nproc-contradicts-cpu": "contradicts",
    "master-port-in-use": "already in use",
    "endpoint-in-use": "already in use",
    "unknown-subcommand": "frobnicate",
    "iface-missing": "--iface nope: no such network interface on this machine",
    "timeout-not-seconds": "--timeout 0 is not a number of seconds",
    "train-iface-missing": "expected one of: ",
    "train-cpu-zero": "--cpu 0",
    "train-batch-not-divisible": "--batch-size 63 is not divisible",
    "train-epochs-zero": "argument --epochs: 0 must be a positive finite number",
    "train-abbreviation": "unrecognized arguments: --epoch 1",
    "train-out-is-a-file": "s.py is a file, not a directory",
    "run-env-strategy": "MULTIGPU_STRATEGY='bogus' (from the environment) is not one of auto,",
    "run-env-backend": "MULTIGPU_BACKEND='mpi' (from the environment) is not one of auto,",
    "train-env-device": "MULTIGPU_DEVICE='tpu' (from the environment) is not one of auto, cpu",
    "train-env-deterministic": "MULTIGPU_DETERMINISTIC='maybe' (from the environment) is not 1",
    "run-env-log-level": "MULTIGPU_LOG_LEVEL='loud' (from the environment) is not one of",
    "max-restarts-negative": "--max-restarts -1 is out of range: expected a number of restarts",
    "monitor-interval-negative": "--monitor-interval -1 is out of range",
    "lm-pipeline-bf16": "--precision bf16-mixed with --strategy pipeline is not supported",
    "lm-pipeline-accumulation": "--accumulation-steps 2 with --strategy pipeline",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple]]:
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "sitecustomize.py").write_text(WORKER_MARK)
    path = os.pathsep.join([str(SRC), str(hooks)])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        cwds, procs = {}, {}
        for name, argv in CASES.items():
            cwd = tmp_path_factory.mktemp(name)
            (cwd / "s.py").write_text("raise SystemExit('must never run')\n")
            cwds[name] = cwd
            argv = [a.replace("{port}", port) for a in argv]
            procs[name] = popen_multigpu(argv, cwd, PYTHONPATH=path, **ENV.get(name, {}))
        done = {}
        for name, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            files = sorted(p.name for p in cwds[name].rglob("*"))
            done[name] = (proc.returncode, out, err, files)
    yield done


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2(name: str, results: dict[str, tuple]) -> None:
    code, out, err, files = results[name]
    lines = err.splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("multigpu: error: "), err
    assert EXPECTED[name] in lines[0]
    assert "Traceback" not in err and out == ""
    assert files == ["s.py"]  # nothing written, no worker started
