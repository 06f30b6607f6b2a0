"""Module-level models and workers for FSDP on models with shared parameters (run_distributed
pickles the workers by name; the unit-choice tests build the same models)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import multigpu
from multigpu.runtime.seed import seed_everything


class TiedLM(nn.Module):
    """An embedding that is also the output head, a layer between: no repeated block."""

    def __init__(self, vocab: int = 1000, dim: int = 128) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.body = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.emb(x))))


class SharedBlock(nn.Module):
    """A block holding its own layer and one that every block shares (the same module)."""

    def __init__(self, shared: nn.Linear, dim: int) -> None:
        super().__init__()
        self.shared = shared
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x)) + self.shared(x)


class SharingNet(nn.Module):
    """Two blocks sharing one layer, between an embedding and a head."""

    def __init__(self, dim: int = 16, vocab: int = 50) -> None:
        super().__init__()
        shared = nn.Linear(dim, dim)
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([SharedBlock(shared, dim), SharedBlock(shared, dim)])
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


CASES: dict[str, tuple[Callable[[], nn.Module], Sequence[type[nn.Module]] | None]] = {
    "tied": (TiedLM, None),  # default units: the embedding and the head, one unit
    "tied, embedding given": (TiedLM, (nn.Embedding,)),  # the head is with the root: so is it
    "shared module": (SharingNet, None),  # a unit of its own inside the blocks
}
BATCH = 8  # global


def _train(ctx: Any, make: Callable[[], nn.Module], steps: int) -> dict[str, Any]:
    """AdamW steps under ``ctx`` beside the same steps on a plain copy over the whole batch."""
    seed_everything(0)
    net = make()
    plain = copy.deepcopy(net)  # ties and shared modules copied as such
    model, opt = ctx.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    tied = getattr(model, "head", None) is not None and model.head.weight is model.emb.weight
    vocab = plain.emb.num_embeddings
    g = torch.Generator().manual_seed(1)
    mine = slice(ctx.rank * BATCH // ctx.world_size, (ctx.rank + 1) * BATCH // ctx.world_size)
    for _ in range(steps):
        x, y = (torch.randint(0, vocab, (BATCH, 6), generator=g) for _ in range(2))
        ctx.backward(F.cross_entropy(model(x[mine]).flatten(0, 1), y[mine].flatten()))
        opt.step()
        opt.zero_grad()
        F.cross_entropy(plain(x).flatten(0, 1), y.flatten()).backward()
        plain_opt.step()
        plain_opt.zero_grad()
    state = ctx.full_state_dict(model)
    return {
        "units": ctx.strategy.describe()["units"],
        "tied": tied,
        "state": state,
        "plain": plain.state_dict() if state else {},
    }


def tied_runs(steps: int) -> dict[str, dict[str, Any]]:
    """Every case of CASES under FSDP on this world size, in one process group."""
    out: dict[str, dict[str, Any]] = {}
    with multigpu.init(strategy="fsdp", seed=0):
        for label, (make, blocks) in CASES.items():
            strategy = multigpu.FSDPStrategy(blocks=blocks)
            with multigpu.init(strategy=strategy, seed=0) as ctx:  # the same process group
                out[label] = _train(ctx, make, steps)
    return out
