"""``strategy="auto"``: DDP where the model's state fits a rank, FSDP where it does not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.estimate import Capacity, choose, cpu_capacity, estimate_memory
from multigpu.testing import run_distributed
from tests.strategies import auto_workers

GIB = 2**30


def test_two_processes_keep_ddp_with_room_and_shard_under_a_memory_limit() -> None:
    # 300 MiB more per process: DDP's ~256 MiB does not fit with room for activations (80 %),
    # FSDP's ~140 MiB does.
    results = run_distributed(auto_workers.choices, world_size=2, args=(300,))
    for result in results:
        assert (result["free"], result["capped"]) == ("ddp", "fsdp")
    # DDP asked for by name: a clear line, not a killed process. The ranks may run out at
    # different allocations (malloc's arenas are not the same size on both); the one that ran
    # out first says it, its peer may instead find it gone from the group (seen in CI).
    rank, said = next(
        ((r, res["ddp"]) for r, res in enumerate(results) if not res["ddp"].startswith("peer: ")),
        (None, str([res["ddp"] for res in results])),
    )
    assert said.startswith(f"rank {rank} (") and "ran out of memory in ctx." in said, said
    assert "under ddp needs ~0.25 GiB per rank (fsdp: ~0.14 GiB)" in said, said
    assert "RLIMIT_DATA" in said and "use strategy='fsdp' (or 'auto')" in said, said


def test_the_choice_keeps_room_for_activations() -> None:
    with torch.device("meta"):
        net = nn.Sequential(*(nn.Linear(4096, 4096) for _ in range(16)))  # 268M parameters
    est = estimate_memory(net, world_size=2)
    ddp = est.of("ddp").total
    # AdamW, float32: params, grads, 2 states (no buckets: gradient_as_bucket_view)
    assert ddp == 16 * est.parameters * 1
    assert choose(est, Capacity(bytes=int(ddp / 0.79), source="x"))[0] == "ddp"
    name, why = choose(est, Capacity(bytes=int(ddp / 0.81), source="x"))
    assert name == "fsdp" and "does not fit a rank whole" in why
    name, why = choose(est, Capacity(bytes=GIB, source="x"))
    assert name == "fsdp" and "neither" in why


def test_cpu_capacity_is_the_tightest_bound_and_says_which() -> None:
    files = {
        "/proc/meminfo": "MemAvailable: 16777216 kB\n",  # 16 GiB
        "/proc/self/status": "VmData:\t 1048576 kB\nVmSize:\t 4194304 kB\n",
        "/sys/fs/cgroup/memory.max": str(12 * GIB),
        "/sys/fs/cgroup/memory.current": str(2 * GIB),
    }
    assert cpu_capacity(2, files=files, limits={}).source.startswith("cgroup memory limit")
    assert cpu_capacity(2, files=files, limits={}).bytes == 5 * GIB
    capped = cpu_capacity(2, files=files, limits={"RLIMIT_DATA": 3 * GIB})
    assert capped.bytes == 2 * GIB and capped.source.startswith("RLIMIT_DATA 3.0 GiB")


@pytest.mark.parametrize(("optimizer", "states"), [("adamw", 2), ("sgd", 0), ("sgd-momentum", 1)])
def test_optimizer_state_counts(optimizer: str, states: int) -> None:
    with torch.device("meta"):
        net = nn.Linear(100, 100)
    est = estimate_memory(net, world_size=1, optimizer=optimizer)
    assert est.of("ddp").optimizer == states * 4 * 10_100
    assert est.of("ddp").buffers == 0  # one process: no DDP buckets
