"""Module-level workers of the zoo tests (run_distributed pickles them by name).

Every architecture trains in the same process group, one after another; each run reseeds and
builds its own model, optimizer and loader, so it is the run a process of its own would make.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import multigpu
from multigpu.runtime.seed import seed_everything
from tests.zoo.models import BATCH, ZOO, Arch, dataset

STEPS = 6
SAVE_AT = 3
LR = 0.05
"""SGD with momentum: AdamW's first steps are the gradient's sign, so a parameter whose gradient
is zero but for rounding (an attention key's bias: softmax ignores it) moves by a full step in a
direction the reduction order decides, at 1 and 2 processes alike, and the comparison would
measure that instead of the strategy."""


def train(
    ctx: Any, arch: Arch, *, save: Path | None = None, resume: Path | None = None
) -> dict[str, Any]:
    """SGD for STEPS steps; with ``save``, a checkpoint at SAVE_AT and at the end; with
    ``resume``, from that checkpoint on. The whole final state on rank 0, the losses everywhere."""
    seed_everything(0)
    net = arch.build()
    model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9))
    loader = ctx.loader(dataset(arch), batch_size=BATCH)
    directory = save or (resume.parent if resume else None)
    ckpt = (
        ctx.checkpointer(directory, model=model, optimizer=opt, loader=loader)
        if directory
        else None
    )
    done = ckpt.resume(resume) if ckpt and resume else 0
    losses: list[float] = []
    while done < STEPS:
        for batch in loader:
            loss = arch.loss(model, batch)
            ctx.backward(loss)
            ctx.step(opt)
            done += 1
            losses.append(ctx.all_reduce(loss.item()))
            if ckpt is not None:
                ckpt.step()
                if save is not None and done in (SAVE_AT, STEPS):
                    ckpt.save()
            if done == STEPS:
                break
    if ckpt is not None:
        ckpt.close()
    return {
        "state": ctx.full_state_dict(model),
        "losses": losses,
        "describe": ctx.strategy.describe(),
    }


def one_process(root: str) -> dict[str, Any]:
    """The reference: every architecture on one process, each saving checkpoints, and its final
    weights as transformers writes them (``save_pretrained``: safetensors, tied weights once)."""
    out: dict[str, Any] = {}
    with multigpu.init(strategy="single", seed=0) as ctx:
        for name, arch in ZOO.items():
            out[name] = train(ctx, arch, save=Path(root) / f"single-{name}")
            model = arch.build()
            model.load_state_dict(out[name]["state"])
            model.save_pretrained(Path(root) / f"pretrained-{name}")  # type: ignore[operator]
    return out


def from_pretrained(ctx: Any, arch: Arch, directory: Path) -> dict[str, Any]:
    """``arch`` built on the meta device, set up (each rank allocates its part and initialises
    it by the model's own scheme), then its weights read from a ``save_pretrained`` directory
    (shaped as ``train``'s result, with no losses: nothing trains)."""
    with ctx.init_module():
        net = arch.build()
    model = ctx.setup(net)
    ctx.load(directory, {"model": model})
    return {"state": ctx.full_state_dict(model), "losses": []}


def _sharded(fsdp: Any, root: str) -> dict[str, Any]:
    """Every architecture under ``fsdp``: trained (saving checkpoints), resumed from the
    one-process checkpoint of step SAVE_AT, and loaded from its ``save_pretrained`` weights into
    a meta-built model."""
    out: dict[str, Any] = {"device": str(fsdp.device)}
    for name, arch in ZOO.items():
        out[f"fsdp-{name}"] = train(fsdp, arch, save=Path(root) / f"fsdp-{name}")
        step = Path(root) / f"single-{name}" / f"step-{SAVE_AT:08d}"
        out[f"resumed-{name}"] = train(fsdp, arch, resume=step)
        out[f"pretrained-{name}"] = from_pretrained(fsdp, arch, Path(root) / f"pretrained-{name}")
    return out


def two_processes(root: str) -> dict[str, Any]:
    """``_sharded`` on two processes, then every architecture under ddp (the export test reads
    the fsdp checkpoints)."""
    with multigpu.init(strategy="fsdp", seed=0) as fsdp:
        out = _sharded(fsdp, root)
        with multigpu.init(strategy="ddp", seed=0) as ddp:  # the same process group
            for name, arch in ZOO.items():
                out[f"ddp-{name}"] = train(ddp, arch)
    return out


def sharded_alone(root: str) -> dict[str, Any]:
    """``_sharded`` on one process (the GPU test: one GPU, NCCL)."""
    with multigpu.init(strategy="fsdp", seed=0) as fsdp:
        return _sharded(fsdp, root)
