"""The README's commands on a machine with GPUs: what the CPU tests check with ``--cpu``, here
with the default device choice (skipped without a GPU).

Written after the first run on a lent H100: the CPU tests had assumed a CPU-only machine.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from multigpu.cli.main import main
from multigpu.examples.digits import DigitsCNN
from tests.launch._util import run_multigpu

pytestmark = pytest.mark.requires("gpus>=1")
SCRIPT = str(Path(__file__).resolve().parents[1] / "launch" / "scripts" / "allreduce.py")


def test_the_default_is_one_process_per_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run", SCRIPT]) == 0
    plan = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    gpus = torch.cuda.device_count()
    assert plan["devices"].strip().startswith("cuda GPUs [0: ")
    assert plan["processes"].strip().startswith(f"{gpus} per node")
    assert "note" not in plan  # the CPU-only machine's note
    env = dict(item.split("=", 1) for item in shlex.split(plan["env"]))
    assert env["CUDA_VISIBLE_DEVICES"].count("GPU-") == gpus  # UUIDs: stable across reorders
    assert "MULTIGPU_DEVICE" not in env


def test_train_learns_on_the_gpus(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_multigpu(["train", "--out", str(out)], tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["device"] == "cuda" and metrics["world_size"] == torch.cuda.device_count()
    assert metrics["test_accuracy"] >= 0.95
    model = DigitsCNN()
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))  # plain, CPU tensors


def test_doctor_proves_nccl(tmp_path: Path) -> None:
    done = run_multigpu(["doctor", "--json"], tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {f"{c['where']}{c['group']}/{c['name']}": c for c in json.loads(done.stdout)["checks"]}
    assert rows["cuda/runtime"]["status"] == "OK"
    assert rows["process group/all-reduce"]["status"] == "OK"
    assert ", nccl: " in rows["process group/all-reduce"]["value"]


def test_bench_comm_on_the_gpus(tmp_path: Path) -> None:
    argv = ["bench", "comm", "--sizes", "1M", "--iters", "3", "--warmup", "1"]
    done = run_multigpu([*argv, "--json"], tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["backend"] == "nccl" and doc["world_size"] == torch.cuda.device_count()
    assert all(row["correct"] for row in doc["rows"])
    if doc["world_size"] == 1:
        text = run_multigpu(argv, tmp_path, timeout=180).stdout
        assert "one process: nothing crossed a link" in text and "peak busbw" not in text


def test_verify_on_one_gpu_compares_cpu_processes(tmp_path: Path) -> None:
    if torch.cuda.device_count() != 1:
        pytest.skip("the fallback is for a machine with exactly one GPU")
    done = run_multigpu(["verify", "--steps", "5"], tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "comparing CPU processes (gloo) instead" in done.stderr
    assert "PASS" in done.stdout
