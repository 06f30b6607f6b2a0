"""The work multigpu adds to each training step, timed piece by piece in one process.

A 1 % target is below what end-to-end timings resolve on a shared 2-core machine (neighbouring
runs of the same job differ by several percent even when interleaved). The extra work itself is
deterministic and small, so it is timed here directly, each piece against what a hand-written
loop does instead, interleaved, many thousand times:

- the loader: one batch of ``ctx.loader`` (``ShardSampler`` + ``DistributedLoader``: cursor,
  epoch, move to the device) against a ``DataLoader`` with a ``DistributedSampler`` — the same
  data, per-rank batch and rank (0 of 2);
- the backward: ``ctx.backward(loss)`` against ``loss.backward()`` on a one-element graph, plus
  the collective recorder's entry for the backward (the hang explainer: a stack walk and two
  writes to the mapped trace file that ``multigpu run`` gives every rank), which a
  distributed ``ctx.backward`` adds.

In a tight loop this code runs with hot caches; in place, between the forward and backward
passes, the same Python costs several times more: paired.py measures that (main-thread CPU of
hand-written DDP with ``ctx.loader`` or ``ctx.backward`` swapped in), and it is the figure to
hold against the target.

Prints one JSON object: microseconds per batch / per step for each piece and their sum.

Run:  python benchmarks/overhead/extra_work.py   (BENCH_MODEL, BENCH_BATCH: see workload.py)

Environment variables read: ``BENCH_*`` (see workload.py).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import workload
from torch.utils.data import DataLoader, DistributedSampler

import multigpu
from multigpu.data import make_loader
from multigpu.instruments.hang.recorder import CollectiveLog

ROUNDS = 15


def per_call_us(fn: Callable[[], int], seconds: float = 0.05) -> float:
    """Microseconds per unit of work ``fn`` returns (e.g. batches), over ~``seconds``."""
    units, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        units += fn()
    return (time.perf_counter() - started) / units * 1e6


def interleaved(pieces: dict[str, Callable[[], int]]) -> dict[str, float]:
    """Median microseconds per unit of each piece, the pieces taking turns ``ROUNDS`` times."""
    times: dict[str, list[float]] = {name: [] for name in pieces}
    for fn in pieces.values():
        per_call_us(fn)  # warm-up
    for _ in range(ROUNDS):
        for name, fn in pieces.items():
            times[name].append(per_call_us(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    torch.set_num_threads(1)
    cfg = workload.settings()
    dataset = workload.build_dataset(cfg)
    per_rank = cfg.batch // 2

    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=2, rank=0, shuffle=False, drop_last=True
    )
    plain = DataLoader(dataset, batch_size=per_rank, sampler=sampler, drop_last=True)
    ours = make_loader(
        dataset,
        batch_size=cfg.batch,
        rank=0,
        world_size=2,
        shuffle=False,
        drop_last=True,
        device=torch.device("cpu"),
    )

    def plain_epoch() -> int:
        return sum(1 for _ in plain)

    def our_epoch() -> int:
        return sum(1 for _ in ours)

    weight = torch.ones(1, requires_grad=True)
    with tempfile.TemporaryDirectory() as tmp, multigpu.init(seed=None) as ctx:
        recorder = CollectiveLog(trace_path=str(Path(tmp) / "rank-0.trace"))

        def plain_backward() -> int:
            (weight * 2).sum().backward()
            return 1

        def our_backward() -> int:
            ctx.backward((weight * 2).sum())
            return 1

        def record() -> int:
            with recorder.record("backward (DDP gradient all-reduce)", [weight]):
                pass
            return 1

        us = interleaved(
            {
                "DataLoader + DistributedSampler": plain_epoch,
                "ctx.loader": our_epoch,
                "loss.backward()": plain_backward,
                "ctx.backward(loss)": our_backward,
                "recorder entry": record,
            }
        )
    extra = {
        "loader": us["ctx.loader"] - us["DataLoader + DistributedSampler"],
        "backward": us["ctx.backward(loss)"] - us["loss.backward()"],
        "recorder": us["recorder entry"],
    }
    json.dump({"us": us, "extra_us": extra, "total_us": sum(extra.values())}, sys.stdout)


if __name__ == "__main__":
    main()
