"""Training stall of a checkpoint save: synchronous vs ``async_save=True``, in one run.

The stall is how long ``Checkpointer.save()`` blocks the training loop. A synchronous save
blocks for serialising, writing, fsyncing and committing; an asynchronous one only for copying
the state to CPU memory (a background thread writes it). Both are measured on the same model,
interleaved (sync, async, sync, async, ...) so the machine's noise hits both alike; the copy
alone (``clone`` of every tensor) is measured too, as the floor the async stall should meet.

Run:  python benchmarks/async_save.py [--mb 80] [--repeats 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import multigpu


def model_of(megabytes: int) -> torch.nn.Module:
    """An MLP with about ``megabytes`` MB of float32 parameters (Adam doubles the state)."""
    width = 2048
    layers = max(1, megabytes * 1024 * 1024 // (4 * width * width))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=80, help="parameter megabytes (80)")
    parser.add_argument("--repeats", type=int, default=5, help="saves of each kind (5)")
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, multigpu.init(seed=0) as ctx:
        model = model_of(args.mb)
        optimizer = torch.optim.Adam(model.parameters())
        model(torch.zeros(1, 2048)).sum().backward()
        optimizer.step()  # Adam's state exists: the checkpoint holds ~3x the parameters
        state_mb = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
        sync = ctx.checkpointer(Path(tmp) / "sync", keep=1, model=model, optimizer=optimizer)
        background = ctx.checkpointer(
            Path(tmp) / "async", keep=1, async_save=True, model=model, optimizer=optimizer
        )
        stalls: dict[str, list[float]] = {"sync": [], "async": [], "copy only": []}
        for _ in range(args.repeats):
            for name, ckpt in (("sync", sync), ("async", background)):
                ckpt.step()
                started = time.perf_counter()
                ckpt.save()
                stalls[name].append(time.perf_counter() - started)
                ckpt.wait()  # not part of the stall: training would run meanwhile
            started = time.perf_counter()
            copies = [t.clone() for t in model.state_dict().values()]
            copies += [t.clone() for s in optimizer.state.values() for t in s.values()]
            stalls["copy only"].append(time.perf_counter() - started)
            del copies
        base = statistics.median(stalls["sync"])
        print(f"model {state_mb:.0f} MB of parameters (+ Adam state), {args.repeats} saves each")
        print(f"{'save':<10} {'median stall':>13} {'min':>9} {'vs sync':>8}")
        for name, values in stalls.items():
            med = statistics.median(values)
            print(f"{name:<10} {med * 1000:>10.1f} ms {min(values) * 1000:>6.1f} ms "
                  f"{med / base:>7.3f}x")  # fmt: skip


if __name__ == "__main__":
    main()
