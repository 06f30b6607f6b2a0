"""What FSDP's per-block units cost on tiny blocks: step time, per block against the root only.

multigpu makes a model's blocks FSDP units at any size (``multigpu.strategies.fsdp_units``):
each unit is one all-gather in the forward, one in the backward and one reduce-scatter per step.
On blocks this small the memory they save is nothing, so this measures what they cost: the
transformer of pytorch/examples' FSDP2 example (``distributed/FSDP2/model.py``: 10 blocks, vocab
1024, sequence 64; its dim 16 makes ~3.3k parameters a block), and the same at dim 128 (~198k a
block), trained with AdamW on 2 gloo processes, one thread each. Per size, one process group
holds both models — per-block units (the default) and one unit for everything (blocks naming a
class the model lacks) — and they take turns in rounds of ``--steps`` steps, so the machine's
noise hits both alike; figures are medians over the rounds' mean step times.

Run: python benchmarks/fsdp_units.py [--rounds 8] [--steps 10]

Environment variables read: none (run_distributed's workers run with OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import multigpu
from multigpu.runtime.seed import seed_everything
from multigpu.testing import run_distributed

VOCAB, SEQ, LAYERS, BATCH = 1024, 64, 10, 32  # the example's sizes; BATCH is global


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, dim)
        self.pos_embeddings = nn.Embedding(SEQ, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def _steps(ctx: Any, model: nn.Module, opt: torch.optim.Optimizer, n: int) -> float:
    """Mean seconds per step of ``n`` AdamW steps on random tokens (this rank's share)."""
    g = torch.Generator().manual_seed(ctx.rank)
    start = time.perf_counter()
    for _ in range(n):
        x = torch.randint(0, VOCAB, (BATCH // ctx.world_size, SEQ + 1), generator=g)
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        ctx.backward(loss)
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - start) / n


def worker(dim: int, rounds: int, steps: int) -> dict[str, Any]:
    """Both unit choices in one process group, taking turns; rank 0's times."""
    runs: dict[str, tuple[Any, nn.Module, torch.optim.Optimizer]] = {}
    with multigpu.init(strategy="fsdp", seed=0):
        choices = {"per block": None, "root only": (nn.Transformer,)}  # absent: no unit
        for label, blocks in choices.items():
            ctx = multigpu.init(strategy=multigpu.FSDPStrategy(blocks=blocks), seed=0)
            seed_everything(0)
            net = Transformer(dim)
            model, opt = ctx.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
            _steps(ctx, model, opt, 2)  # warm-up
            runs[label] = (ctx, model, opt)
        times: dict[str, list[float]] = {label: [] for label in runs}
        for r in range(rounds):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for label in order:
                times[label].append(_steps(*runs[label], steps))
        out = {
            "units": {
                label: len(run[0].strategy.describe()["units"]) for label, run in runs.items()
            },
            "block_params": sum(p.numel() for p in Block(dim).parameters()),
            "ms": {label: 1000 * statistics.median(t) for label, t in times.items()},
        }
        for ctx, _, _ in runs.values():
            ctx.teardown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print("| dim | parameters a block | units | ms/step per block | ms/step root only | ratio |")
    print("|---|---|---|---|---|---|")
    for dim in (16, 128):
        r, _ = run_distributed(
            worker, world_size=2, args=(dim, args.rounds, args.steps), timeout=1800
        )
        ms = r["ms"]
        print(
            f"| {dim} | {r['block_params']:,} | {r['units']['per block']} vs "
            f"{r['units']['root only']} | {ms['per block']:.1f} | {ms['root only']:.1f} | "
            f"{ms['per block'] / ms['root only']:.2f}x |"
        )


if __name__ == "__main__":
    main()
