"""Same results on 1 or N processes: training, and gradient accumulation (real gloo processes).

Two process starts: one process runs every configuration without accumulation (the reference),
two processes run them all, the last two with 2 micro-steps per optimizer step.
"""

from __future__ import annotations

from typing import Any

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


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    (alone,) = run_distributed(workers.train_all, world_size=1, args=(False,))
    pair = run_distributed(workers.train_all, world_size=2, args=(True,), timeout=240)
    return {"alone": alone, "pair": pair}


@pytest.mark.parametrize(
    ("index", "kind", "dtype"),
    [(i, kind, dtype) for i, (kind, dtype, _, micro) in enumerate(workers.RUNS) if micro == 1],
)
def test_two_processes_train_like_one(
    runs: dict[str, Any], index: int, kind: str, dtype: str
) -> None:
    alone = runs["alone"][index]
    assert alone["per_rank_batch"] == 32
    assert max_relative_difference(alone["state"], alone["initial"]) > 1e-2  # it really trained
    for rank in runs["pair"]:
        result = rank[index]
        assert result["per_rank_batch"] == 16 and result["steps"] == 100
        assert max_relative_difference(result["state"], alone["state"]) <= BOUND[dtype]


@pytest.mark.parametrize(
    ("index", "dtype"),
    [(i, dtype) for i, (_, dtype, _, micro) in enumerate(workers.RUNS) if micro == 2],
)
def test_accumulation_two_processes_two_micro_steps_equals_one_big_step(
    runs: dict[str, Any], index: int, dtype: str
) -> None:
    alone = runs["alone"][index]
    steps = workers.RUNS[index][2]
    for rank in runs["pair"]:
        result = rank[index]
        assert result["per_rank_batch"] == 8  # 32 = 8 per micro-batch × 2 micro-steps × 2 ranks
        assert result["micro_steps"] == 2 * steps
        # The tiny model fits one DDP bucket: one all-reduce per optimizer step, none in between.
        assert result["allreduces"] == steps
        assert max_relative_difference(result["state"], alone["state"]) <= BOUND[dtype]
