"""The pipeline tests on GPUs: two stages on two GPUs over NCCL give one GPU's unsplit numbers.

The CPU tests' workers (``tests/strategies/pipeline_workers.py``) with ``device="cuda"``: rank r
on ``cuda:r``, activations and gradients sent between the GPUs by NCCL point-to-point ops.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.strategies import pipeline_workers
from tests.strategies.test_pipeline import STEPS, max_relative

pytestmark = pytest.mark.requires("gpus>=2")


@pytest.fixture(scope="module")
def alone() -> dict[str, Any]:
    (result,) = run_distributed(
        pipeline_workers.train, world_size=1, args=("single", STEPS), device="cuda"
    )
    return result  # type: ignore[no-any-return]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stages_on_two_gpus_train_like_one_gpu(alone: dict[str, Any], schedule: str) -> None:
    rank0, rank1 = run_distributed(
        pipeline_workers.several,
        world_size=2,
        args=([(schedule, STEPS)],),
        device="cuda",
        timeout=240,
    )
    run0, run1 = rank0[0], rank1[0]
    assert run0["losses"] == run1["losses"]
    assert max(abs(a - b) for a, b in zip(run0["losses"], alone["losses"], strict=True)) <= 1e-5
    assert max_relative(run0["state"], alone["state"]) <= 1e-4
    assert all(t.device.type == "cpu" for t in run0["state"].values())
    assert torch.allclose(run1["out"], alone["out"], atol=1e-4)
