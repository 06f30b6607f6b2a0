"""Same results on 1 or N processes: training, and gradient accumulation (real gloo processes)."""

from __future__ import annotations

import pytest
import torch

from multigpu.testing import run_distributed
from tests.invariance import workers

BOUND = {"float32": 1e-5, "float64": 1e-10}


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    worst = 0.0
    for name, expected in b.items():
        scale = expected.abs().max().item() + 1e-12
        worst = max(worst, (a[name] - expected).abs().max().item() / scale)
    return worst


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_two_processes_train_like_one(kind: str, dtype: str) -> None:
    steps = 100
    (alone,) = run_distributed(workers.train, world_size=1, args=(kind, dtype, steps))
    pair = run_distributed(workers.train, world_size=2, args=(kind, dtype, steps))
    assert alone["per_rank_batch"] == 32 and pair[0]["per_rank_batch"] == 16
    assert max_relative_difference(alone["state"], alone["initial"]) > 1e-2  # it really trained
    for result in pair:
        assert result["steps"] == steps
        assert max_relative_difference(result["state"], alone["state"]) <= BOUND[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_accumulation_two_processes_two_micro_steps_equals_one_big_step(dtype: str) -> None:
    steps = 30
    (alone,) = run_distributed(workers.train, world_size=1, args=("mlp", dtype, steps, 1))
    pair = run_distributed(workers.train, world_size=2, args=("mlp", dtype, steps, 2))
    for result in pair:
        assert result["per_rank_batch"] == 8  # 32 = 8 per micro-batch × 2 micro-steps × 2 ranks
        assert result["micro_steps"] == 2 * steps
        # The tiny model fits one DDP bucket: one all-reduce per optimizer step, none in between.
        assert result["allreduces"] == steps
        assert max_relative_difference(result["state"], alone["state"]) <= BOUND[dtype]
