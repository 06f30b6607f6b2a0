"""``init(compile=)`` with FSDP, tensor parallel and DDP on two gloo processes: the same
training as eager, and the wrappers in torchtitan's order (checkpointing inside compile inside
``fully_shard``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from multigpu.testing import run_distributed
from tests.strategies import compile_workers


def max_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in b)


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    rank0, rank1 = run_distributed(compile_workers.every_run, world_size=2, timeout=240)
    assert all(run["state"] == {} for run in rank1.values())  # the whole state: rank 0's
    return rank0  # type: ignore[no-any-return]


def test_compiled_training_equals_eager_under_fsdp_tp_and_ddp(runs: dict[str, Any]) -> None:
    start = compile_workers.lm.build_model(**compile_workers.SHAPE)  # trained: it moved
    for eager, compiled in (
        ("fsdp eager", "fsdp compiled, full"),
        ("tp eager", "tp compiled, selective"),  # parallelize_module, then the same three
        ("ddp eager", "ddp compiled, selective"),
    ):
        assert max_relative(runs[eager]["state"], start.state_dict()) > 1e-3
        assert max_relative(runs[compiled]["state"], runs[eager]["state"]) <= 1e-5, compiled


def test_each_fsdp_block_is_checkpointed_inside_compile_inside_fully_shard(
    runs: dict[str, Any],
) -> None:
    fsdp = runs["fsdp compiled, full"]
    for block in fsdp["blocks"]:  # FSDP<Checkpointed<Block>>, its call compiled
        assert block == {
            "sharded": True,
            "compiled": True,
            "checkpointing": "full",
            "class": "FSDPCheckpointedBlock",
        }
    assert fsdp["root"]["sharded"] and not fsdp["root"]["compiled"]  # blocks, not the model
    described = fsdp["describe"]
    assert described["compile"] == "aot_eager" and described["activation_checkpointing"] == "full"
    eager = runs["fsdp eager"]
    assert all(not b["compiled"] and b["checkpointing"] is None for b in eager["blocks"])
    assert eager["describe"]["activation_checkpointing"] is False


def test_ddp_wraps_the_root_around_checkpointed_compiled_blocks(runs: dict[str, Any]) -> None:
    ddp = runs["ddp compiled, selective"]
    assert ddp["outer"] == "DistributedDataParallel"
    assert [b["compiled"] and b["checkpointing"] for b in ddp["blocks"]] == ["selective"] * 2
    assert not ddp["root"]["compiled"]
    assert ddp["describe"]["activation_checkpointing"] == "selective"
