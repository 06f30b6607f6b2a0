"""Workers of tests/strategies/test_ddp_allocator.py (importable by the fork server)."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

import multigpu

BLOCK = 20 * 2**20
"""Bytes of the probe while DDP runs: over glibc's first mmap threshold (128 KiB), under 32 MiB."""
LATER = 30 * 2**20
"""Bytes of the probe after the teardown: more than the first probe left free in the heap."""


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def mapped_bytes() -> int:
    """Bytes glibc holds in blocks of their own mapping (``hblkhd``)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    return int(libc.mallinfo2().hblkhd)


def probe_is_mapped(size: int) -> bool:
    """Whether a fresh tensor of ``size`` bytes gets a mapping of its own (not the heap)."""
    before = mapped_bytes()
    block = torch.empty(size // 4)
    grew = mapped_bytes() - before >= size
    del block
    return grew


def ddp_step_then_teardown() -> dict[str, Any]:
    """A DDP step on CPU; where a 20 MiB block goes while the Context lives, a 30 MiB one after."""
    ctx = multigpu.init(strategy="ddp")
    net = torch.nn.Linear(64, 64)
    model, optimizer = ctx.setup(net, torch.optim.AdamW(net.parameters()))
    ctx.backward(model(torch.randn(4, 64)).square().mean())
    ctx.step(optimizer)
    during = probe_is_mapped(BLOCK)
    kept = ctx.strategy._keeps_freed_memory  # what this test is about
    weight = model.module.weight.detach().clone()
    del model, optimizer
    ctx.teardown()
    return {"mapped_during": during, "mapped_after": probe_is_mapped(LATER), "kept": kept,
            "weight": weight}  # fmt: skip
