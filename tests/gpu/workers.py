"""Workers of the GPU tests: the CPU tests' workers, on CUDA with NCCL, TF32 off.

TF32 (cuDNN's default for convolutions on Ampere and later) rounds inputs to 10-bit mantissas:
the world-size comparisons below are about reduction order, at float32 precision.
"""

from __future__ import annotations

from typing import Any

import torch

import multigpu
from tests.checkpoint import reshard_workers
from tests.strategies import fsdp_workers


def _full_float32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def equivalence(strategy: str, steps: int) -> list[dict[str, Any]]:
    """The FSDP tests' runs (digits CNN and LM, with and without accumulation) on GPUs."""
    _full_float32()
    return fsdp_workers.equivalence(strategy, steps)


def fsdp_then_ddp_norms(steps: int) -> dict[str, list[float]]:
    _full_float32()
    return fsdp_workers.fsdp_then_ddp_norms(steps)


def initial_weights(strategy: str, meta: bool) -> dict[str, torch.Tensor]:
    return fsdp_workers.initial_weights(strategy, meta)


def save_runs(root: str) -> dict[str, Any]:
    _full_float32()
    return reshard_workers.save_runs(root)


def resume_runs(root: str, sources: list[str]) -> dict[str, Any]:
    _full_float32()
    return reshard_workers.resume_runs(root, sources)


def where_and_what() -> dict[str, Any]:
    """Device, backend and the dtypes FSDP's bf16 policy computes in, on this rank's GPU."""
    with multigpu.init(strategy="fsdp", precision="bf16-mixed", seed=0) as ctx:
        net = fsdp_workers.build("lm")
        model, opt = ctx.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
        x = torch.randint(0, 256, (4, 16), device=ctx.device)
        losses = []
        for _ in range(20):
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, 256), x.reshape(-1))
            ctx.backward(loss)
            ctx.step(opt)
            losses.append(float(loss))
        return {
            "device": str(ctx.device),
            "backend": ctx.backend,
            "param": str(next(model.parameters()).device),
            "out": str(out.dtype),
            "first_loss": losses[0],
            "last_loss": losses[-1],
        }


def data_parallel() -> dict[str, Any]:
    """The CNN on DataParallel over every visible GPU vs on one GPU: 20 SGD steps each."""
    _full_float32()
    out: dict[str, Any] = {}
    for strategy in ("single", "dp"):
        with multigpu.init(strategy=strategy, seed=0) as ctx:
            out[strategy] = fsdp_workers.train(ctx, "cnn", 20)
            out[f"{strategy}_type"] = type(ctx.setup(torch.nn.Linear(1, 1))).__name__
    return out
