"""The GPU versions of the strategy tests: NCCL, one GPU per process (skipped without GPUs).

They run the CPU tests' own workers with ``run_distributed(..., device="cuda")``; the CPU tests
say what is being proven, these say that it holds on GPUs too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multigpu.testing import run_distributed
from tests.gpu import workers

pytestmark = pytest.mark.requires("gpus>=1")
STEPS = 100


def _max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


def test_fsdp_on_one_gpu_with_bf16_learns_on_the_gpu() -> None:
    (result,) = run_distributed(workers.where_and_what, world_size=1, device="cuda")
    assert result["device"] == "cuda:0" and result["param"] == "cuda:0"
    assert result["out"] == "torch.float32"  # FSDP's output_dtype: float32 outside the model
    assert result["last_loss"] < result["first_loss"]


def test_meta_init_on_a_gpu_gives_the_eager_cpu_weights() -> None:
    (eager,) = run_distributed(workers.initial_weights, world_size=1, args=("single", False))
    (meta,) = run_distributed(
        workers.initial_weights, world_size=1, args=("fsdp", True), device="cuda"
    )
    for name, tensor in eager.items():
        assert torch.equal(meta[name], tensor), name


@pytest.mark.requires("gpus>=2")
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_two_gpus_train_like_one(strategy: str) -> None:
    (alone,) = run_distributed(
        workers.equivalence, world_size=1, args=("single", STEPS), device="cuda"
    )
    pair, _ = run_distributed(
        workers.equivalence, world_size=2, args=(strategy, STEPS), device="cuda"
    )
    for run, reference in zip(pair, alone, strict=True):
        assert _max_relative(run["state"], reference["state"]) <= 1e-5
        if reference["norms"]:
            assert run["norms"] == pytest.approx(reference["norms"], rel=1e-5)


@pytest.mark.requires("gpus>=2")
def test_clipping_norms_of_fsdp_equal_ddp_on_two_gpus() -> None:
    norms, _ = run_distributed(workers.fsdp_then_ddp_norms, world_size=2, args=(20,), device="cuda")
    assert norms["fsdp"] == pytest.approx(norms["ddp"], rel=1e-5)


@pytest.mark.requires("gpus>=2")
def test_gpu_checkpoints_reshard_between_fsdp_and_ddp(tmp_path: Path) -> None:
    from tests.checkpoint import reshard_workers as rw

    root = str(tmp_path)
    saved, _ = run_distributed(workers.save_runs, world_size=2, args=(root,), device="cuda")
    (resumed,) = run_distributed(
        workers.resume_runs, world_size=1, args=(root, ["fsdp2", "ddp2"]), device="cuda"
    )
    for label, run in resumed.items():
        assert run["resumed"] == rw.STOP, label
        target = saved["fsdp" if label.endswith("fsdp") else "ddp"]["state"]
        assert _max_relative(run["state"], target) <= 1e-5, label


@pytest.mark.requires("gpus>=2")
def test_data_parallel_over_two_gpus_trains_like_one() -> None:
    (result,) = run_distributed(workers.data_parallel, world_size=1, device="cuda")
    assert result["dp_type"] == "DataParallel" and result["single_type"] == "Linear"
    assert _max_relative(result["dp"]["state"], result["single"]["state"]) <= 1e-5
