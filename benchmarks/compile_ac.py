"""torch.compile and activation checkpointing on the LM of ``multigpu train --model lm``, FSDP.

Two tables from one process group of 2 gloo processes (one thread each):

1. **Compiled vs eager.** Two copies of the LM from the same seed, FSDP with each Block a unit,
   one compiled per block (``init(compile=BACKEND)``, inductor by default), trained on the same
   batches of the standard library's bytes in interleaved rounds of ``--steps`` steps (the first
   round of each is the warm-up: it holds the compile). Tokens/s per round (all ranks), the
   ratio compiled / eager per round (median, min-max), and at the end the validation loss of
   both on the same windows: they trained identically, so they must agree to float rounding.
2. **Activation checkpointing policies**: none, full, selective (eager), then none and a memory
   budget of 0.5 compiled: the median step time, and the step's peak memory above the memory
   before it (CUDA: ``max_memory_allocated``; CPU: the bytes glibc's malloc holds, sampled
   after the forward, where the activations peak).

Run: python benchmarks/compile_ac.py [--n-layer 4 --n-embd 128 --block-size 64 --batch-size 32]
     [--rounds 5 --steps 8] [--backend inductor]
Tiny check: python benchmarks/compile_ac.py --n-layer 2 --n-embd 32 --block-size 16
     --rounds 3 --steps 3 --corpus-mb 0.2

Environment variables read: none (run_distributed's workers run with OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

import multigpu
from multigpu.examples import lm, lm_data
from multigpu.runtime.seed import seed_everything
from multigpu.testing import run_distributed

POLICIES: list[tuple[str, object, bool]] = [
    ("none", False, False),
    ("full", "full", False),
    ("selective", "selective", False),
    ("none, compiled", False, True),
    ("budget 0.5, compiled", 0.5, True),
]
"""(label, activation_checkpointing, compiled) of the second table."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_bytes() -> int:
    """Bytes this process holds through malloc now (small blocks in arenas, and mmapped ones)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


class Run:
    """One model being trained: its Context, the wrapped model, the optimizer, the batches."""

    def __init__(self, args: argparse.Namespace, checkpointing: object, backend: str | None):
        strategy = multigpu.FSDPStrategy(blocks=(lm.Block,), activation_checkpointing=checkpointing)
        self.ctx = multigpu.init(strategy, seed=0, compile=backend or False)
        seed_everything(0)
        shape = {k: getattr(args, k) for k in ("n_layer", "n_head", "n_embd", "block_size")}
        net = lm.build_model(**shape)
        self.model, self.opt = self.ctx.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-3))
        corpus = lm_data.load_corpus(int(args.corpus_mb * 1e6))
        self.val = lm_data.evenly_spaced(corpus.val, args.block_size, 64, self.ctx.world_size)
        windows = lm_data.Windows(corpus.train, args.block_size)
        self.batches = iter(self.ctx.loader(windows, batch_size=args.batch_size))
        self.windows, self.batch_size = windows, args.batch_size
        self.tokens_per_step = args.batch_size * args.block_size

    def _next(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return next(self.batches)
        except StopIteration:
            self.batches = iter(self.ctx.loader(self.windows, batch_size=self.batch_size))
            return next(self.batches)

    def steps(self, n: int, *, memory: bool = False) -> tuple[float, int]:
        """Mean seconds per step of ``n`` steps (the slowest rank's), and the largest peak above
        the memory before a step (this rank's, when ``memory``)."""
        cuda = self.ctx.device.type == "cuda"
        peak = 0
        start = time.perf_counter()
        for _ in range(n):
            x, y = self._next()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() if cuda else heap_bytes() if memory else 0
            loss = F.cross_entropy(self.model(x).flatten(0, 1), y.flatten())
            if memory:
                now = torch.cuda.max_memory_allocated() if cuda else heap_bytes()
                peak = max(peak, now - before)
            self.ctx.backward(loss)
            self.ctx.step(self.opt)
        if cuda:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / n
        slowest = max(self.ctx.gather(seconds))
        return slowest, peak

    @torch.no_grad()
    def val_loss(self) -> float:
        """Mean cross-entropy over the validation windows (each counted once)."""
        total = torch.zeros(2, dtype=torch.float64)
        for x, y in self.ctx.loader(self.val, batch_size=16, shuffle=False):
            loss = F.cross_entropy(self.model(x).flatten(0, 1), y.flatten(), reduction="sum")
            total += torch.tensor([float(loss), y.numel()], dtype=torch.float64)
        loss_sum, tokens = self.ctx.all_reduce(total, op="sum").tolist()
        return float(loss_sum / tokens)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Both tables in one process group; rank 0's figures."""
    out: dict[str, Any] = {}
    with multigpu.init(strategy="fsdp", seed=0) as owner:
        runs = {"eager": Run(args, False, None), "compiled": Run(args, False, args.backend)}
        warm = {label: run.steps(args.steps)[0] for label, run in runs.items()}  # compiles
        tokens: dict[str, list[float]] = {label: [] for label in runs}
        for r in range(args.rounds):
            for label in list(runs) if r % 2 == 0 else list(reversed(runs)):
                run = runs[label]
                tokens[label].append(run.tokens_per_step / run.steps(args.steps)[0])
        out["warm_s"] = warm
        out["tokens"] = tokens
        out["val"] = {label: run.val_loss() for label, run in runs.items()}
        for run in runs.values():
            run.ctx.teardown()
        table = []
        for label, checkpointing, compiled in POLICIES:
            run = Run(args, checkpointing, args.backend if compiled else None)
            run.steps(2)  # warm-up (and the compile)
            seconds, peak = run.steps(args.steps, memory=True)
            peaks = owner.gather(peak)
            table.append((label, seconds, max(peaks)))
            run.ctx.teardown()
        out["policies"] = table
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--n-layer", type=int, default=4)
    add("--n-head", type=int, default=4)
    add("--n-embd", type=int, default=128)
    add("--block-size", type=int, default=64)
    add("--batch-size", type=int, default=32, help="global sequences per step")
    add("--corpus-mb", type=float, default=1.0)
    add("--rounds", type=int, default=5, help="interleaved rounds after the warm-up")
    add("--steps", type=int, default=8, help="steps per round")
    add("--backend", default="inductor", help="torch.compile backend (inductor)")
    args = parser.parse_args()
    started = time.perf_counter()
    (r, _) = run_distributed(worker, world_size=2, args=(args,), timeout=1800)
    eager, compiled = r["tokens"]["eager"], r["tokens"]["compiled"]
    ratios = [c / e for c, e in zip(compiled, eager, strict=True)]
    shape = f"{args.n_layer} layers x {args.n_embd} wide, context {args.block_size}"
    print(
        f"LM ({shape}), FSDP on 2 processes, global batch {args.batch_size}, backend "
        f"{args.backend}; {args.rounds} interleaved rounds of {args.steps} steps after warm-up\n"
    )
    print("| model | warm-up round (s/step) | tokens/s (median) | vs eager (median, min-max) |")
    print("|---|---|---|---|")
    print(f"| eager | {r['warm_s']['eager']:.2f} | {statistics.median(eager):,.0f} | 1.00x |")
    print(
        f"| compiled | {r['warm_s']['compiled']:.2f} | {statistics.median(compiled):,.0f} | "
        f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
    )
    val_e, val_c = r["val"]["eager"], r["val"]["compiled"]
    agree = abs(val_e - val_c) <= 1e-4 * abs(val_e)
    print(
        f"\nvalidation loss: eager {val_e:.6f}, compiled {val_c:.6f} "
        f"(difference {abs(val_e - val_c):.1e}: {'agree' if agree else 'DIFFER'})\n"
    )
    print("| activation checkpointing | step (ms) | peak memory above the step's start (MiB) |")
    print("|---|---|---|")
    for label, seconds, peak in r["policies"]:
        print(f"| {label} | {1000 * seconds:.1f} | {peak / 2**20:.1f} |")
    print(f"\n({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
