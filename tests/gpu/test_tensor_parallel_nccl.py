"""The GPU versions of the tensor-parallel and model-parallel tests: NCCL, one GPU per process.

They run the CPU tests' own workers (``tests/strategies/tensor_parallel_workers.py``,
``tests/strategies/test_model_parallel.py``) on GPUs; the CPU tests say what is being proven.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.strategies import tensor_parallel_workers as workers
from tests.strategies.test_model_parallel import run_both

pytestmark = pytest.mark.requires("gpus>=2")


def _max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


def _check(run: dict[str, Any], reference: dict[str, torch.Tensor]) -> None:
    straight = run["straight"]["state"]
    assert _max_relative(straight, reference) < 1e-5
    assert run["resumed"]["resumed"] == workers.HALF
    assert _max_relative(run["resumed"]["state"], straight) < 1e-6


def test_tensor_parallel_over_two_gpus_trains_like_one_process_and_resumes(
    tmp_path: Path,
) -> None:
    results = run_distributed(
        workers.two_d, world_size=2, args=(str(tmp_path), ("tp",)), device="cuda", timeout=240
    )
    assert results[0]["tp"]["mesh"] == (("dp_shard", "tp"), (1, 2))
    assert results[0]["tp"]["straight"]["seen"] == results[1]["tp"]["straight"]["seen"]
    _check(results[0]["tp"], results[0]["reference"]["state"])


@pytest.mark.requires("gpus>=4")
def test_tp_with_fsdp_and_hsdp_on_a_2x2_mesh_of_gpus(tmp_path: Path) -> None:
    results = run_distributed(
        workers.two_d, world_size=4, args=(str(tmp_path),), device="cuda", timeout=300
    )
    for kind in workers.KINDS:
        _check(results[0][kind], results[0]["reference"]["state"])


def test_the_tutorials_model_on_two_gpus_gives_the_ported_models_losses() -> None:
    original, ported = run_both(["cuda:0", "cuda:1"])
    assert ported == original
