"""A padded language model for the token-weighted loss tests (module level: workers import it).

Sequences of 2 to 12 tokens padded to 12, labels ``-100`` on the padding: micro-batches hold
different numbers of tokens, so a per-micro-batch mean weights tokens differently at each world
size and accumulation, and ``ctx.backward(loss_sum, num_items=n)`` must not.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.runtime.seed import seed_everything

VOCAB = 11
LENGTH = 12
GLOBAL_BATCH = 16
STEPS = 2
LR = 0.5
MAX_NORM = 0.05  # below the gradient's norm: clipping shapes the steps


class TinyLM(nn.Module):
    """Embedding, two blocks, a head (a pipeline splits it at ``blocks.1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(16, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def padded_data() -> TensorDataset:
    """``STEPS`` global batches of token sequences with labels ``-100`` on the padding."""
    g = torch.Generator().manual_seed(7)
    n = GLOBAL_BATCH * STEPS
    lengths = torch.randint(2, LENGTH + 1, (n,), generator=g)
    tokens = torch.randint(1, VOCAB, (n, LENGTH + 1), generator=g)
    x, y = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    pad = torch.arange(LENGTH)[None, :] >= (lengths[:, None] - 1)
    x[pad], y[pad] = 0, -100
    return TensorDataset(x, y)


def loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
    )


def items(labels: torch.Tensor) -> torch.Tensor:
    return (labels != -100).sum()


def model(dtype: torch.dtype = torch.float64) -> TinyLM:
    seed_everything(0)
    return TinyLM().to(dtype)


def reference(clip: float | None) -> dict[str, Any]:
    """One process, the whole global batch at once, plain torch: the gradient of the mean loss
    over every token of the step."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    x, y = padded_data().tensors
    losses = []
    for step in range(STEPS):
        batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        xs, ys = x[batch], y[batch]
        opt.zero_grad()
        loss = loss_sum(net(xs), ys) / items(ys)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return {"state": net.state_dict(), "losses": losses}


def train(
    ctx: Any,
    loop: str,
    accumulation: int,
    clip: float | None,
    dtype: torch.dtype = torch.float64,
    epochs: int = 1,
) -> dict[str, Any]:
    """``STEPS`` optimizer steps an epoch of ``loop``: ``plain`` (the user's
    ``optimizer.step()``), ``accumulate`` (``ctx.accumulate`` + ``ctx.step``), ``naive`` (a
    per-micro-batch mean), ``forward_backward`` (``ctx.forward_backward(..., num_items=n)``)."""
    net = model(dtype)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    wrapped, opt = ctx.setup(net, opt)
    loader = ctx.loader(
        padded_data(), batch_size=GLOBAL_BATCH, shuffle=False, accumulation_steps=accumulation
    )
    losses = []
    for x, y in (batch for _ in range(epochs) for batch in loader):
        if loop == "plain":
            opt.zero_grad()
            ctx.backward(loss_sum(wrapped(x), y), num_items=items(y))
            if clip is not None:
                ctx.clip_grad_norm(wrapped, opt, clip)
            opt.step()
        elif loop == "forward_backward":
            returned = ctx.forward_backward(
                wrapped, x, target=y, loss_fn=loss_sum, num_items=items(y)
            )
            if clip is not None:
                ctx.clip_grad_norm(wrapped, opt, clip)
            ctx.step(opt)
        else:
            with ctx.accumulate(wrapped):
                if loop == "naive":
                    mean = F.cross_entropy(wrapped(x).flatten(0, 1), y.flatten())
                    ctx.backward(mean)
                else:
                    ctx.backward(loss_sum(wrapped(x), y), num_items=items(y))
                if clip is not None:
                    ctx.clip_grad_norm(wrapped, opt, clip)
                ctx.step(opt)
        if loop == "forward_backward":  # what it returns: the batch's loss per item
            losses.append(float(returned))
        elif ctx.sync_step and ctx.step_loss is not None:
            losses.append(ctx.step_loss)
    return {"state": ctx.full_state_dict(wrapped), "losses": losses}


RUNS: list[tuple[str, str, int, float | None]] = [
    ("ddp", "plain", 1, None),
    ("ddp", "accumulate", 4, MAX_NORM),
    ("ddp", "naive", 4, None),
    ("fsdp", "plain", 1, MAX_NORM),
    ("fsdp", "accumulate", 2, None),
    ("pipeline", "forward_backward", 1, MAX_NORM),
]
"""(strategy, loop, accumulation steps, clipping norm) of the 2-process runs."""


def pipeline() -> multigpu.PipelineStrategy:
    return multigpu.PipelineStrategy(
        example_input=torch.zeros(GLOBAL_BATCH, LENGTH, dtype=torch.long),
        split_points=["blocks.1"],
        microbatches=4,
    )


def train_all() -> dict[str, dict[str, Any]]:
    """Every run of ``RUNS`` in one process group (a process start costs seconds)."""
    out: dict[str, dict[str, Any]] = {}
    with multigpu.init(strategy="ddp", seed=0) as ddp:
        for strategy, loop, accumulation, clip in RUNS:
            name = f"{strategy}-{loop}-{accumulation}"
            if strategy == "ddp":
                out[name] = train(ddp, loop, accumulation, clip)
                continue
            chosen = pipeline() if strategy == "pipeline" else strategy
            with multigpu.init(strategy=chosen, seed=0) as ctx:  # the same process group
                out[name] = train(ctx, loop, accumulation, clip)
    return out


def one_process(precision: str, epochs: int) -> dict[int, dict[str, Any]]:
    """Accumulation 1 and 4 in float32 on this process's device (a GPU under
    ``run_distributed(..., device="cuda")``): states, step losses, the GradScaler's last scale."""
    out: dict[int, dict[str, Any]] = {}
    with multigpu.init(seed=0):
        for accumulation in (1, 4):
            with multigpu.init(precision=precision, seed=0) as ctx:  # the same process group
                ran = train(ctx, "accumulate", accumulation, MAX_NORM, torch.float32, epochs)
                scaler = ctx.precision.scaler
                ran["scale"] = None if scaler is None else scaler.get_scale()
                ran["device"] = str(ctx.device)
                out[accumulation] = ran
    return out
