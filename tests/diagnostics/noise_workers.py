"""A tiny attention model whose key bias gets a gradient that is zero but for rounding, trained
under ``multigpu verify``'s recorder (module level: workers import it).

Scores are ``q_i . (W_k h_j + b)``: the bias adds ``q_i . b`` to every score of row ``i``, which
softmax ignores, so the exact gradient of ``b`` is zero and the computed one is rounding noise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu

VOCAB = 13
WIDTH = 16
STEPS = 3


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.q = nn.Linear(WIDTH, WIDTH)
        self.k = nn.Linear(WIDTH, WIDTH)
        self.v = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        scores = self.q(h) @ self.k(h).transpose(1, 2) / WIDTH**0.5
        return self.head(torch.softmax(scores, dim=-1) @ self.v(h))


def data() -> TensorDataset:
    tokens = torch.randint(0, VOCAB, (16 * STEPS, 9), generator=torch.Generator().manual_seed(3))
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def train(strategy: str) -> None:
    """``STEPS`` SGD steps (the records go where ``MULTIGPU_VERIFY_DIR`` says)."""
    with multigpu.init(strategy=strategy, seed=0) as ctx:
        net = Attention()
        model, optimizer = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.5))
        for x, y in ctx.loader(data(), batch_size=16):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad()
            ctx.backward(loss)
            optimizer.step()


def squared_norms_of_shards() -> tuple[list[float], list[float]]:
    """``squared_norms`` of an FSDP model's sharded gradients, and of the whole ones."""
    from multigpu.instruments.verify_record import squared_norms

    with multigpu.init(strategy="fsdp", seed=0) as ctx:
        net = Attention()
        model = ctx.setup(net)
        x, y = data().tensors
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        grads = [p.grad for p in model.parameters()]
        whole = [float(g.full_tensor().double().norm() ** 2) for g in grads]  # type: ignore[union-attr]
        return squared_norms(grads), whole  # type: ignore[arg-type]
