"""Module-level workers for the pipeline tests (run_distributed pickles them by name).

One small model (an input layer, four blocks, a head), trained with SGD and momentum on a fixed
regression set through ``ctx.forward_backward``, its gradients clipped by ``ctx.clip_grad_norm``
— the same loop under every strategy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.runtime.seed import seed_everything

BATCH = 16
SAMPLES = 160  # 10 steps an epoch: runs cross epochs
MICROBATCHES = 4
MAX_NORM = 0.5  # below most steps' gradient norm: the clipping shapes the run


class Net(nn.Module):
    """Input layer, ``blocks`` (a ModuleList of four), head: split at ``blocks.2`` in two."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(x, torch.sin(x[:, :4] * 2) + 0.1 * torch.randn(SAMPLES, 4, generator=g))


def strategy(schedule: str) -> Any:
    if schedule == "single":
        return "single"
    return multigpu.PipelineStrategy(
        example_input=torch.zeros(BATCH, 8),
        split_points=None if schedule == "interleaved-1f1b" else ["blocks.2"],
        schedule=schedule,
        microbatches=MICROBATCHES,
        stages_per_process=2 if schedule == "interleaved-1f1b" else 1,
    )


def train(
    schedule: str,
    steps: int,
    ckpt_dir: str | None = None,
    resume_from: int | None = None,
    stop: int | None = None,
) -> dict[str, Any]:
    """``steps`` optimizer steps (stop early at ``stop``); saves every 5 steps to ``ckpt_dir``."""
    with multigpu.init(strategy(schedule), seed=0) as ctx:
        seed_everything(0)
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        model, opt = ctx.setup(net, opt)
        loader = ctx.loader(data(), batch_size=BATCH)
        ckpt = None
        if ckpt_dir is not None:
            ckpt = ctx.checkpointer(
                ckpt_dir, every_steps=5, model=model, optimizer=opt, loader=loader
            )
            if resume_from is not None:
                ckpt.resume(Path(ckpt_dir) / f"step-{resume_from:08d}")
        step = ckpt.steps if ckpt is not None else 0
        losses: list[float] = []
        norms: list[float] = []
        while step < (stop or steps):
            for x, y in loader:
                loss = ctx.forward_backward(model, x, target=y, loss_fn=F.mse_loss)
                norms.append(float(ctx.clip_grad_norm(model, opt, MAX_NORM)))
                ctx.step(opt)
                losses.append(float(loss))
                step += 1
                if ckpt is not None:
                    ckpt.step()
                if step == (stop or steps):
                    break
        state = ctx.full_state_dict(model)
        local = sorted(ctx.unwrap(model).state_dict())
        # The pipelined model is a SplitModel: unwrapped by its type, not as torch.compile's
        # wrapper, and its own state dict has the whole model's names.
        plain = ctx.unwrap(model) is getattr(model, "plain", model)
        plain = plain and not hasattr(model, "_orig_mod") and sorted(model.state_dict()) == local
        evaluated = multigpu.Mean()  # every process reads every batch: each counts once
        with torch.no_grad():  # evaluation: the output on every rank
            out = model(data().tensors[0][:8])
            for x, y in ctx.loader(data(), batch_size=BATCH, shuffle=False):
                evaluated.update(F.mse_loss(model(x), y, reduction="none").mean(dim=1))
        evaluated.compute()
        bubble = ctx.strategy.bubble(model) if schedule != "single" else None
        out = out.cpu()  # the parent may have no GPU context
        return {"losses": losses, "norms": norms, "state": state, "local": local, "out": out,
                "bubble": bubble, "evaluated": evaluated.count, "plain": plain}  # fmt: skip


def several(runs: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Each run of ``runs`` (``train``'s arguments) one after another in this process, in one
    process group (the outer context's: each run's context reuses it)."""
    with multigpu.init(strategy="single" if len(runs) and runs[0][0] == "single" else "ddp"):
        return [train(*run) for run in runs]


def refused(kind: str) -> str:
    """The one-line UsageError a bad pipeline gives before any step, or "" when none."""
    try:
        with multigpu.init(_bad_strategy(kind), seed=0) as ctx:
            net = Net()
            model = ctx.setup(net)
            loader = ctx.loader(data(), batch_size=BATCH if kind != "batch" else 10)
            for x, y in loader:
                ctx.forward_backward(model, x, target=y, loss_fn=F.mse_loss)
                break
    except multigpu.UsageError as e:
        return str(e)
    except SystemExit as e:  # a launched rank says a UsageError in one line and exits 2
        assert e.code == 2
        return str(e.__cause__)
    return ""


def _bad_strategy(kind: str) -> Any:
    if kind == "no-example":
        return "pipeline"
    points = {"name": ["blocks.9"], "stages": ["blocks.1", "blocks.2"]}.get(kind, ["blocks.2"])
    return multigpu.PipelineStrategy(
        example_input=torch.zeros(BATCH, 8), split_points=points, microbatches=MICROBATCHES
    )


def several_refusals(kinds: list[str]) -> list[str]:
    """``refused`` of each kind, one after another in this process (one process group)."""
    with multigpu.init(strategy="ddp"):
        return [refused(kind) for kind in kinds]
