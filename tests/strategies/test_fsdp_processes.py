"""FSDP with real gloo processes: the same training as one process, clipping, meta init, options.

FSDP2 on CPU processes is the real thing (``fully_shard`` over a gloo DeviceMesh): parameters,
gradients and optimizer state are sharded, all-gathered and reduce-scattered exactly as on GPUs.
Two process starts in all: one process runs every reference, two run everything sharded.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.strategies import fsdp_workers

STEPS = 50
SHORT = 20


def max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


@pytest.fixture(scope="module")
def alone() -> dict[str, Any]:
    (result,) = run_distributed(fsdp_workers.one_process, world_size=1, args=(STEPS,))
    return result  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def sharded() -> dict[str, Any]:
    rank0, rank1 = run_distributed(
        fsdp_workers.two_processes, world_size=2, args=(STEPS, SHORT), timeout=240
    )
    assert all(run["state"] == {} for run in rank1["runs"])  # the whole state is rank 0's alone
    assert rank1["meta"] == {}
    return rank0  # type: ignore[no-any-return]


def test_fsdp_on_two_processes_trains_like_one_process(
    alone: dict[str, Any], sharded: dict[str, Any]
) -> None:
    runs = zip(fsdp_workers.RUNS, alone["runs"], sharded["runs"], strict=True)
    for (kind, acc, clip), one, two in runs:
        label = f"{kind}, {acc} micro-step(s)"
        assert two["describe"]["mesh"] == {"dp_shard": 2}, label
        assert max_relative(two["state"], fsdp_workers.build_state_zero(kind)) > 1e-2, label
        assert max_relative(two["state"], one["state"]) <= 1e-5, label
        if clip is not None:  # the norm over sharded gradients is the one-process norm
            assert len(two["norms"]) == STEPS
            assert two["norms"] == pytest.approx(one["norms"], rel=1e-5), label
    assert sharded["runs"][2]["describe"]["units"] == ["blocks.0", "blocks.1", "<root>"]


def test_the_last_block_and_the_root_stay_gathered_after_the_forward(
    sharded: dict[str, Any],
) -> None:
    # Their backward comes first: resharding them would only gather them again at once.
    after = sharded["sharded_after_forward"]
    assert all(after[name] for name in after if name.startswith("blocks.0.")), after
    kept = [name for name in after if not name.startswith("blocks.0.")]
    assert kept and not any(after[name] for name in kept), after


def test_clipping_norms_under_fsdp_equal_ddp_on_two_processes(sharded: dict[str, Any]) -> None:
    assert len(sharded["fsdp_norms"]) == SHORT
    assert sharded["fsdp_norms"] == pytest.approx(sharded["ddp_norms"], rel=1e-5)


def test_meta_init_gives_the_eager_weights_at_any_world_size(
    alone: dict[str, Any], sharded: dict[str, Any]
) -> None:
    eager = alone["eager"]
    for meta in (alone["meta"], sharded["meta"]):
        assert meta.keys() == eager.keys()
        for name, tensor in eager.items():
            assert torch.equal(meta[name], tensor), name  # bitwise, the draw after it too


def test_fsdp_options_keep_the_numbers_and_bf16_trains(sharded: dict[str, Any]) -> None:
    runs = sharded["variants"]
    default = runs["default"]["state"]
    assert runs["blocks+checkpointing"]["describe"]["units"] == ["blocks.0", "blocks.1", "<root>"]
    assert runs["blocks+checkpointing"]["describe"]["activation_checkpointing"] == "full"
    assert max_relative(runs["blocks+checkpointing"]["state"], default) <= 1e-6
    assert max_relative(runs["no reshard"]["state"], default) <= 1e-6
    bf16 = runs["bf16-mixed"]["state"]
    assert all(t.dtype == torch.float32 for t in bf16.values())  # sharded weights stay fp32
    assert 1e-6 < max_relative(bf16, default) <= 5e-2  # rounded in bf16, not another run
