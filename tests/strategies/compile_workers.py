"""Module-level workers for the compile tests (run_distributed pickles them by name).

One process group runs every configuration in turn (a process start costs seconds on 2 cores):
each run reseeds and builds its own tiny GPT, so it is the run a process of its own would make.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import multigpu
from multigpu.examples import lm
from multigpu.runtime.seed import seed_everything
from multigpu.strategies.activation_checkpointing import checkpointing_of
from multigpu.torch_compat import fsdp_module_class

STEPS = 4
SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16}


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS global batches of 8 sequences of bytes (each rank takes its half)."""
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, 256, (STEPS, 8, 17), generator=g)
    return [(s[:, :-1], s[:, 1:]) for s in seq]


def block_facts(block: nn.Module) -> dict[str, Any]:
    """What wraps a block, outside in: sharded by FSDP, compiled, checkpointed (and how)."""
    return {
        "sharded": isinstance(block, fsdp_module_class()),
        "compiled": getattr(block, "_compiled_call_impl", None) is not None,
        "checkpointing": checkpointing_of(block),
        "class": type(block).__name__,
    }


def train(ctx: Any) -> dict[str, Any]:
    """STEPS AdamW steps of the tiny GPT; its whole final state (rank 0) and its tree."""
    seed_everything(0)
    net = lm.build_model(**SHAPE)
    model, opt = ctx.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
    index, shards = ctx.strategy.data_shard(ctx.rank, ctx.world_size)  # a TP group: one batch
    share = 8 // shards
    for x, y in batches():
        mine = slice(index * share, (index + 1) * share)
        logits = model(x[mine])
        ctx.backward(F.cross_entropy(logits.flatten(0, 1), y[mine].flatten()))
        ctx.step(opt)
    plain = ctx.unwrap(model)
    return {
        "state": ctx.full_state_dict(model),
        "describe": ctx.strategy.describe(),
        "outer": type(model).__name__,
        "root": block_facts(plain),
        "blocks": [block_facts(b) for b in plain.blocks],
    }


def _tp(checkpointing: str | bool = False) -> multigpu.Strategy:
    """Each block's MLP split over the 2 ranks (column- then row-wise)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for i in range(SHAPE["n_layer"]):
        plan[f"blocks.{i}.mlp.c_fc"] = ColwiseParallel()
        plan[f"blocks.{i}.mlp.c_proj"] = RowwiseParallel()
    return multigpu.TensorParallelStrategy(
        plan, tensor_parallel=2, activation_checkpointing=checkpointing
    )


RUNS: dict[str, tuple[Any, Any]] = {
    "fsdp eager": (lambda: multigpu.FSDPStrategy(), None),
    "fsdp compiled, full": (
        lambda: multigpu.FSDPStrategy(activation_checkpointing="full"),
        "aot_eager",
    ),
    "tp eager": (_tp, None),
    "tp compiled, selective": (lambda: _tp("selective"), "aot_eager"),
    "ddp eager": (lambda: multigpu.DDPStrategy(), None),
    "ddp compiled, selective": (
        lambda: multigpu.DDPStrategy(activation_checkpointing="selective"),
        "aot_eager",
    ),
}
"""label: (the strategy, the compile backend)."""


def every_run() -> dict[str, dict[str, Any]]:
    """Every configuration of RUNS in one process group (the first context owns it)."""
    out: dict[str, dict[str, Any]] = {}
    with multigpu.init(strategy="ddp", seed=0):
        for label, (strategy, backend) in RUNS.items():
            with multigpu.init(strategy=strategy(), seed=0, compile=backend or False) as ctx:
                out[label] = train(ctx)
    return out
