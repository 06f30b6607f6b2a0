"""Module-level workers for pipelines whose stages share parameters (run_distributed pickles them).

Two small models: a language model whose output head is its embedding (``head.weight`` is
``emb.weight``, as in every GPT-style LM), and a chain that runs its first block a second time
later in the forward. Both train with AdamW (weight decay) and gradient clipping through
``ctx.forward_backward``, the same loop under every strategy; the run ends with a checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.runtime.seed import seed_everything

BATCH = 16
SAMPLES = 64
MICROBATCHES = 4
VOCAB, DIM, SEQ = 32, 16, 8
MAX_NORM = 0.3  # below most steps' gradient norm: the clipping shapes both runs
STEPS = 8


class TiedLM(nn.Module):
    """Embedding, four blocks, a head whose weight *is* the embedding's."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(4))
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class Reused(nn.Module):
    """Input layer, four blocks, head; ``blocks.0`` runs again after ``blocks.2``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, DIM)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(4))
        self.head = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        for block in (self.blocks[0], self.blocks[1], self.blocks[2], self.blocks[0]):
            h = block(h)
        return self.head(self.blocks[3](h))


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def data(kind: str) -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    if kind == "lm":
        x = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1), generator=g)
        return TensorDataset(x[:, :-1], x[:, 1:])
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(x, torch.sin(x[:, :4] * 2))


def example(kind: str) -> torch.Tensor:
    return torch.zeros(BATCH, SEQ, dtype=torch.long) if kind == "lm" else torch.zeros(BATCH, 8)


def build(kind: str) -> nn.Module:
    seed_everything(0)
    return TiedLM() if kind == "lm" else Reused()


def strategy(kind: str, schedule: str) -> Any:
    """``schedule``: "single", "fsdp", or a pipeline schedule (interleaved: 4 stages)."""
    if schedule == "single":
        return "single"
    if schedule == "fsdp":  # the embedding and the head it is tied to stay in the root unit
        return multigpu.FSDPStrategy(blocks=(nn.Sequential,))
    interleaved = schedule == "interleaved-1f1b"
    points = ["blocks.1", "blocks.2", "blocks.3"] if interleaved else ["blocks.2"]
    return multigpu.PipelineStrategy(
        example_input=example(kind),
        split_points=points,
        schedule=schedule,
        microbatches=MICROBATCHES,
    )


def _loss_fn(kind: str) -> Any:
    return lm_loss if kind == "lm" else F.mse_loss


def whole_optimizer_state(ctx: Any, model: nn.Module, opt: Any) -> dict[str, Any]:
    """The optimizer's state of the whole model on rank 0, by parameter name (collective)."""
    saved = ctx.strategy.optimizer_state(model, opt)
    mine = {
        name: {
            k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
            for k, v in stats.items()
        }
        for name, stats in saved["state"].items()
    }
    parts: list[Any] = [mine]
    if dist.is_initialized():
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
    merged = {name: stats for part in parts for name, stats in part.items()}
    groups = [dict(g) for g in saved["param_groups"]]
    return {"state": merged, "param_groups": groups} if ctx.rank == 0 else {}


def _snapshot(ctx: Any, model: nn.Module, opt: Any) -> dict[str, Any]:
    """The whole model's parameters and optimizer state on rank 0, copied (collective)."""
    state = {k: v.detach().clone() for k, v in ctx.full_state_dict(model).items()}
    return {"state": state, "optimizer": whole_optimizer_state(ctx, model, opt)}


def train(
    kind: str,
    schedule: str,
    directory: str | None = None,
    *,
    every: int | None = None,
    resume: str | None = None,
    late: bool = False,
) -> dict[str, Any]:
    """STEPS steps, checkpointed to ``directory`` every ``every`` steps (snapshots of those steps
    under "saved"), after resuming from the checkpoint ``resume`` (a snapshot under "resumed");
    ``late``: the optimizer is built after ``ctx.setup``, on the parameters it kept."""
    with multigpu.init(strategy(kind, schedule), seed=0) as ctx:
        net = build(kind)
        if late:
            model = ctx.setup(net)
            opt = torch.optim.AdamW(ctx.unwrap(model).parameters(), lr=0.01, weight_decay=0.1)
        else:
            opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
            model, opt = ctx.setup(net, opt)
        loader = ctx.loader(data(kind), batch_size=BATCH)
        ckpt = None
        if directory is not None:
            ckpt = ctx.checkpointer(
                directory, every_steps=every, model=model, optimizer=opt, loader=loader
            )
        step, resumed, saved = 0, {}, {}
        if resume is not None:
            assert ckpt is not None
            step = ckpt.resume(resume) or 0
            resumed = _snapshot(ctx, model, opt)
        losses: list[float] = []
        norms: list[float] = []
        while step < STEPS:
            for x, y in loader:
                loss = ctx.forward_backward(model, x, target=y, loss_fn=_loss_fn(kind))
                norms.append(float(ctx.clip_grad_norm(model, opt, MAX_NORM)))
                ctx.step(opt)
                losses.append(float(loss))
                step += 1
                if ckpt is not None and ckpt.step():
                    saved[step] = _snapshot(ctx, model, opt)
                if step == STEPS:
                    break
        with torch.no_grad():  # another batch size: traced again, on the trained tensors
            out = model(data(kind).tensors[0][:8]).cpu()
        plain = ctx.unwrap(model)
        return {
            "losses": losses,
            "norms": norms,
            "out": out,
            **_snapshot(ctx, model, opt),
            "local": {k: v.detach().cpu().clone() for k, v in plain.state_dict().items()},
            "resumed": resumed,
            "saved": saved,
        }


def several(runs: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Each run of ``runs`` (``(args, kwargs)`` of ``train``) in turn, in one process group."""
    with multigpu.init(strategy="ddp"):
        return [train(*args, **kwargs) for args, kwargs in runs]


def refused_resume(directory: str, source: str) -> tuple[str, bool]:
    """Resume ``source`` (a tied LM's checkpoint) into an LM whose head has a bias: the error's
    line, and whether ``directory`` (new) exists afterwards."""
    said = ""
    with multigpu.init(strategy("lm", "1f1b"), seed=0) as ctx:
        net = build("lm")
        net.head = nn.Linear(DIM, VOCAB, bias=True)  # a bias the checkpoint does not have
        opt = torch.optim.AdamW(net.parameters(), lr=0.01)
        model, opt = ctx.setup(net, opt)
        ckpt = ctx.checkpointer(directory, model=model, optimizer=opt)
        try:
            ckpt.resume(source)
        except multigpu.CheckpointMismatchError as e:
            said = f"{type(e).__name__}: {e}"
    return said, Path(directory).exists()


def resumes(runs: list[tuple[Any, ...]], root: str) -> dict[str, Any]:
    """``several(runs)``, then a refused resume of ``root``'s pipeline checkpoint."""
    with multigpu.init(strategy="ddp"):
        done = [train(*args, **kwargs) for args, kwargs in runs]
        source = f"{root}/pipe/step-00000004"
        return {"runs": done, "refused": refused_resume(f"{root}/refused/here", source)}
