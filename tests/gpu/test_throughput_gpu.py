"""Throughput and profiles on GPUs: MFU from the peak table, CUDA activity in the traces
(skipped without a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multigpu.throughput import find_peak
from tests.launch._util import run_multigpu

pytestmark = pytest.mark.requires("gpus>=1")


def test_lm_on_the_gpus_reports_mfu_and_traces_cuda_kernels(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["train", "--model", "lm", "--steps", "40", "--eval-every", "20", "--progress", "lines"]
    argv += ["--precision", "bf16-mixed", "--out", str(out), "--profile", "3:4"]
    done = run_multigpu(argv, tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    last = metrics["history"][-1]
    assert last["peak_memory_bytes"] == metrics["peak_memory_bytes"] > 0
    if find_peak(torch.cuda.get_device_name(0)) is not None:
        assert 0 < last["mfu"] < 1, last
        assert all(" MFU " in ln for ln in done.stdout.splitlines() if ln.startswith("step "))
    if metrics["world_size"] == 1:
        assert last["collective_wait_share"] == 0.0
    events = json.loads((out / "profile" / "rank0.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)  # CUDA activity beside the CPU's
