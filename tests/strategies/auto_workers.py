"""Workers of the auto-strategy test (module level: spawned children import them)."""

from __future__ import annotations

import ctypes
import json
import resource
from typing import Any

import torch
from torch import nn

import multigpu
from multigpu.estimate import estimate_memory
from multigpu.estimate.capacity import status_kib


def _net() -> nn.Module:
    # 16.8M parameters: ~256 MiB of training state per rank under DDP with AdamW, ~140 under FSDP
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


def _small_net() -> nn.Module:
    # 2.1M parameters: ~32 MiB of training state per rank under DDP with AdamW, ~20 under FSDP
    return nn.Sequential(*(nn.Linear(512, 512) for _ in range(8)))


def _setup_short_of_memory(ctx: Any, net: nn.Module, opt: torch.optim.Optimizer) -> Any:
    """``ctx.setup`` with room for the model's state under FSDP only (auto chooses fsdp); the
    limit is lifted once setup returns, so training is not short of memory."""
    # Three quarters of DDP's need: DDP is over the choice's 80 % headroom even when the
    # process's VmData has shrunk by a few MiB by the time setup measures it.
    need = estimate_memory(net, world_size=ctx.world_size).of("ddp").total * 3 // 4
    with open("/proc/self/status") as fh:
        data = status_kib(fh.read(), "VmData")
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (data + need, hard))
    try:
        return ctx.setup(net, opt)
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def one_object_through_the_choice(directory: str) -> dict[str, Any]:
    """Auto chooses fsdp: the strategy object, a loader and a checkpointer made before setup,
    a save and a resume of that save by another run (its own checkpointer made before setup)."""
    _large_allocations_mapped()
    out: dict[str, Any] = {}
    with multigpu.init(seed=0):  # owns the process group; each run below is a Context in it
        with multigpu.init(seed=0) as ctx:
            first = ctx.strategy
            net = _small_net()
            opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
            ckpt = ctx.checkpointer(directory, model=net, optimizer=opt)
            data = torch.utils.data.TensorDataset(torch.randn(6, 512))
            loader = ctx.loader(data, batch_size=4, shuffle=False)  # ranks: 2 and 1 batches
            out["even_before"] = loader.even_batches
            model, opt = _setup_short_of_memory(ctx, net, opt)
            out["same"] = ctx.strategy is first
            out["name"], out["even_after"] = ctx.strategy.name, loader.even_batches
            out["batches"] = len([x for (x,) in loader])  # FSDP: every rank the same number
            ctx.backward(model(torch.randn(4, 512)).square().mean())
            ctx.step(opt)
            ckpt.step()
            saved = ckpt.save()
            out["manifest"] = json.loads((saved / "manifest.json").read_text())["strategy"]
            expected = ctx.full_state_dict(model)
        with multigpu.init(seed=1) as again:  # other initial weights: the resume must set them
            net = _small_net()
            opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
            ckpt = again.checkpointer(directory, model=net, optimizer=opt)
            model, opt = _setup_short_of_memory(again, net, opt)
            out["resumed_name"], out["resumed_step"] = again.strategy.name, ckpt.resume()
            got = again.full_state_dict(model)
            out["resumed_equal"] = list(got) == list(expected) and all(
                torch.equal(got[k], expected[k]) for k in got
            )
    return out
