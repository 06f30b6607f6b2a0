"""Workers of the auto-strategy test (module level: spawned children import them)."""

from __future__ import annotations

import ctypes
import resource
from typing import Any

import torch
from torch import nn

import multigpu
from multigpu.estimate.capacity import status_kib


def _net() -> nn.Module:
    # 16.8M parameters: ~320 MiB of training state per rank under DDP with AdamW, ~140 under FSDP
    return nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(16)))


def _train_one_step(ctx: Any) -> str:
    net = _net()
    model, opt = ctx.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
    ctx.backward(model(torch.randn(4, 1024)).square().mean())
    ctx.step(opt)
    return str(ctx.strategy.name)


def _large_allocations_mapped() -> None:
    """glibc's fixed mmap threshold: freed tensors go back to the OS at once, so the memory in
    use is what the limit sees (with its default dynamic threshold, freed blocks stay in the
    heap, and FSDP's many gathered-then-freed units look bigger than they are)."""
    libc = ctypes.CDLL("libc.so.6")
    m_mmap_threshold = -3
    libc.mallopt(m_mmap_threshold, 128 * 1024)


def choices(cap_mb: int) -> dict[str, str]:
    """What auto picks with this process's memory as it is, then under a data limit; and what
    DDP asked for explicitly says under that limit."""
    _large_allocations_mapped()
    out: dict[str, str] = {}
    with multigpu.init(seed=0) as ctx:
        out["free"] = _train_one_step(ctx)
        with open("/proc/self/status") as fh:
            data = status_kib(fh.read(), "VmData")
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (data + cap_mb * 2**20, hard))
        try:
            with multigpu.init(seed=0) as capped:
                out["capped"] = _train_one_step(capped)
            with multigpu.init(strategy="ddp", seed=0) as forced:
                try:
                    _train_one_step(forced)
                    out["ddp"] = "trained"
                except multigpu.DeviceError as e:
                    out["ddp"] = str(e)
                except RuntimeError as e:  # the other rank ran out first and left the group
                    out["ddp"] = f"peer: {e}"
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    return out
