"""Token-weighted losses on GPUs: the CPU tests' workers (``tests/core/loss_workers.py``) on
CUDA and NCCL (skipped without GPUs); ``tests/core/test_weighted_loss.py`` says what is proven."""

from __future__ import annotations

import pytest

from multigpu.testing import run_distributed
from tests.core import loss_workers as w
from tests.core.test_weighted_loss import EXACT, relative_difference

pytestmark = pytest.mark.requires("gpus>=1")


def test_one_gpu_float32_with_accumulation_gives_the_whole_batch_result() -> None:
    (runs,) = run_distributed(w.one_process, world_size=1, args=("32", 1), device="cuda")
    expected = w.reference(w.MAX_NORM)
    for ran in runs.values():
        assert ran["device"] == "cuda:0"
        assert relative_difference(ran["state"], expected["state"]) <= 1e-5  # float32
        assert ran["losses"] == pytest.approx(expected["losses"], rel=1e-5)


def test_16_mixed_on_a_gpu_skips_at_most_the_first_step() -> None:
    (runs,) = run_distributed(w.one_process, world_size=1, args=("16-mixed", 6), device="cuda")
    for ran in runs.values():
        assert ran["scale"] >= 2.0**14, ran["scale"]  # 12 steps: one or two halvings at most
    assert relative_difference(runs[4]["state"], runs[1]["state"]) <= 1e-2


@pytest.mark.requires("gpus>=2")
def test_two_gpus_give_the_one_process_whole_batch_result() -> None:
    pair = run_distributed(w.train_all, world_size=2, timeout=300, device="cuda")[0]
    for strategy, loop, accumulation, clip in w.RUNS:
        ran = pair[f"{strategy}-{loop}-{accumulation}"]
        diff = relative_difference(ran["state"], w.reference(clip)["state"])
        assert diff > 1e-3 if loop == "naive" else diff <= EXACT, (strategy, loop, diff)
