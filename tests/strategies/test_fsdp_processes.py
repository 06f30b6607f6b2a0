"""FSDP with real gloo processes: the same training as one process, clipping, meta init, options.

FSDP2 on CPU processes is the real thing (``fully_shard`` over a gloo DeviceMesh): parameters,
gradients and optimizer state are sharded, all-gathered and reduce-scattered exactly as on GPUs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.strategies import fsdp_workers

STEPS = 100


def max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


@pytest.fixture(scope="module")
def one_process() -> list[dict[str, Any]]:
    """Every run of RUNS on one process without sharding: the reference."""
    (runs,) = run_distributed(fsdp_workers.equivalence, world_size=1, args=("single", STEPS))
    return runs  # type: ignore[no-any-return]


def test_fsdp_on_two_processes_trains_like_one_process(one_process: list[dict[str, Any]]) -> None:
    sharded, other = run_distributed(fsdp_workers.equivalence, world_size=2, args=("fsdp", STEPS))
    assert all(run["state"] == {} for run in other)  # the whole state is rank 0's alone
    for (kind, acc, clip), alone, pair in zip(fsdp_workers.RUNS, one_process, sharded, strict=True):
        label = f"{kind}, {acc} micro-step(s)"
        assert pair["describe"]["mesh"] == {"dp_shard": 2}, label
        assert max_relative(pair["state"], fsdp_workers.build_state_zero(kind)) > 1e-2, label
        assert max_relative(pair["state"], alone["state"]) <= 1e-5, label
        if clip is not None:  # the norm over sharded gradients is the one-process norm
            assert len(pair["norms"]) == STEPS
            assert pair["norms"] == pytest.approx(alone["norms"], rel=1e-5), label
    lm_units = sharded[2]["describe"]["units"]
    assert lm_units == ["blocks.0", "blocks.1", "<root>"]  # >= 100k parameters each


def test_clipping_norms_under_fsdp_equal_ddp_on_two_processes() -> None:
    first, _ = run_distributed(fsdp_workers.fsdp_then_ddp_norms, world_size=2, args=(20,))
    assert len(first["fsdp"]) == 20
    assert first["fsdp"] == pytest.approx(first["ddp"], rel=1e-5)


def test_meta_init_gives_the_eager_weights_at_any_world_size() -> None:
    (eager,) = run_distributed(fsdp_workers.initial_weights, world_size=1, args=("single", False))
    (meta_one,) = run_distributed(fsdp_workers.initial_weights, world_size=1, args=("fsdp", True))
    meta_two, rest = run_distributed(
        fsdp_workers.initial_weights, world_size=2, args=("fsdp", True)
    )
    assert rest == {}
    for meta in (meta_one, meta_two):
        assert meta.keys() == eager.keys()
        for name, tensor in eager.items():
            assert torch.equal(meta[name], tensor), name  # bitwise, the draw after it too


def test_fsdp_options_keep_the_numbers_and_bf16_trains() -> None:
    runs, _ = run_distributed(fsdp_workers.variants, world_size=2, args=(30,))
    default = runs["default"]["state"]
    assert runs["blocks+checkpointing"]["describe"]["units"] == ["blocks.0", "blocks.1", "<root>"]
    assert runs["blocks+checkpointing"]["describe"]["activation_checkpointing"] is True
    assert max_relative(runs["blocks+checkpointing"]["state"], default) <= 1e-6
    assert max_relative(runs["no reshard"]["state"], default) <= 1e-6
    bf16 = runs["bf16-mixed"]["state"]
    assert all(t.dtype == torch.float32 for t in bf16.values())  # sharded weights stay fp32
    assert 1e-6 < max_relative(bf16, default) <= 5e-2  # rounded in bf16, not another run
