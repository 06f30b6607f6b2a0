"""``strategy="auto"``'s rule: DDP with room to spare, else FSDP, and what would fit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.estimate import Capacity, MemoryEstimate, choose, estimate_memory
from multigpu.estimate.choice import HEADROOM, processes_needed


def _est(world_size: int = 2) -> MemoryEstimate:
    with torch.device("meta"):
        net = nn.Sequential(*(nn.Linear(1000, 1000) for _ in range(8)))  # 8 units of 1.001M
    return estimate_memory(net, world_size=world_size)


def test_ddp_is_kept_up_to_the_headroom_and_fsdp_taken_past_it() -> None:
    est = _est()
    ddp = est.of("ddp").device
    room = int(ddp / HEADROOM)
    assert HEADROOM == 0.8
    assert choose(est, Capacity(bytes=room + 1, source="x"))[0] == "ddp"
    name, why = choose(est, Capacity(bytes=room - 8, source="x"))
    assert name == "fsdp" and "does not fit a rank whole with room to spare" in why, why


def test_fsdp_that_barely_fits_warns_of_little_room_and_neither_says_what_would() -> None:
    est = _est()
    fsdp = est.of("fsdp").device
    name, why = choose(est, Capacity(bytes=fsdp, source="x"))
    assert name == "fsdp" and "little room for activations" in why, why
    name, why = choose(est, Capacity(bytes=fsdp // 2, source="RLIMIT_DATA"))
    assert name == "fsdp" and "fits a rank under neither" in why and "RLIMIT_DATA" in why, why
    assert "or more processes" in why and "sgd keeps none" in why and "offload" not in why


def test_offload_is_suggested_on_gpus_only() -> None:
    est = _est()
    fsdp = est.of("fsdp").device
    _, why = choose(est, Capacity(bytes=fsdp // 2, source="GPU 0", kind="cuda"))
    assert "FSDPStrategy(cpu_offload=True)" in why, why


def test_processes_needed_solves_for_the_shard_beside_the_gathered_units() -> None:
    est = _est()
    fsdp = est.of("fsdp")
    whole = 2 * (fsdp.params + fsdp.grads + fsdp.optimizer)  # the state of 2 ranks
    assert processes_needed(est, fsdp.buffers + whole / 5) == 5
    assert processes_needed(est, fsdp.buffers + whole / 5 - 1) == 6
    assert processes_needed(est, fsdp.buffers) is None


def test_one_process_is_single_and_a_missing_capacity_is_a_usage_error() -> None:
    est = _est(world_size=1)
    assert est.choose(Capacity(bytes=1, source="x"))[0] == "single"
    with pytest.raises(UsageError, match="no capacity to compare with"):
        est.choose()


def test_parameters_already_held_by_the_rank_count_as_room() -> None:
    net = nn.Sequential(*(nn.Linear(256, 256) for _ in range(4)))  # on the CPU: 1 MiB held
    est = estimate_memory(net, world_size=2)
    ddp = est.of("ddp").device
    capacity = Capacity(bytes=int(ddp / HEADROOM) - est.resident_bytes + 8, source="x")
    assert est.choose(capacity)[0] == "ddp"
    with torch.device("meta"):
        ghost = nn.Sequential(*(nn.Linear(256, 256) for _ in range(4)))
    assert estimate_memory(ghost, world_size=2).choose(capacity)[0] == "fsdp"
