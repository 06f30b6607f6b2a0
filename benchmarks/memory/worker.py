"""One rank of one ``benchmarks/memory.py`` run: build, wrap, train a few steps, report.

Started by ``runner.py`` with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` (the variables torchrun sets) and ``OMP_NUM_THREADS=1``.
Writes one JSON object to ``--out``.

Variants:
  ddp-torch   hand-written: ``DistributedDataParallel`` (torch only)
  fsdp-torch  hand-written: ``fully_shard`` on each block, then the root (torch only)
  ddp / fsdp / auto   ``multigpu.init(strategy=...)`` and ``ctx.setup(model, optimizer)``
  paired-fsdp both fsdp-torch and multigpu's fsdp in the same processes, taking turns in
              blocks of steps (for step time only: the fairest comparison on a noisy machine)
  fill        no model: 64 MiB tensors until an allocation fails (under --cap-gib: how much a
              limit lets through, RLIMIT_DATA or RLIMIT_AS by --cap-kind)

Memory: ``VmHWM`` (peak RSS) after the steps minus ``VmRSS`` before the model was built, the
high-water mark reset with ``/proc/self/clear_refs`` once the process group is up. A cap
(``--cap-gib``) is ``RLIMIT_DATA`` (or ``RLIMIT_AS``), set before torch is imported: an
allocation past it fails with torch's ``DefaultCPUAllocator: can't allocate memory``, a Python
exception.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import time
import traceback
from typing import Any

GIB = 2**30


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", required=True)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--blocks", type=int, required=True)
    p.add_argument("--batch", type=int, default=8, help="rows per rank per step")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--turn", type=int, default=2, help="paired: steps per turn")
    p.add_argument("--cap-gib", type=float, default=0.0, help="the limit in GiB (0: none)")
    p.add_argument("--cap-kind", choices=("data", "as"), default="data", help="RLIMIT_DATA/AS")
    p.add_argument("--mmap-threshold", type=int, default=0, help="mallopt M_MMAP_THRESHOLD")
    p.add_argument("--out", required=True)
    return p.parse_args()


def status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS


def build(width: int, blocks: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    block = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)]
    return nn.Sequential(*block)


def batch(step: int, rank: int, args: argparse.Namespace) -> Any:
    import torch

    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(args.batch, args.width, generator=gen)


def hand_written(variant: str, net: Any) -> tuple[Any, Any, str]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    if variant == "ddp-torch":
        model = DistributedDataParallel(net)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4), "ddp"
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    for block in net:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh, reshard_after_forward=False)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-4), "fsdp"


def train_steps(model: Any, opt: Any, ctx: Any, first: int, count: int, args: Any) -> list[float]:
    rank = int(os.environ["RANK"])
    times = []
    for step in range(first, first + count):
        x = batch(step, rank, args)
        start = time.perf_counter()
        loss = model(x).square().mean()
        if ctx is None:
            loss.backward()
            opt.step()
            opt.zero_grad()
        else:
            ctx.backward(loss)
            ctx.step(opt)
        times.append(time.perf_counter() - start)
    return times


def run(args: argparse.Namespace, out: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    ctx = None
    if args.variant in ("ddp-torch", "fsdp-torch", "fill"):
        from datetime import timedelta

        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    else:
        import multigpu

        strategy = "fsdp" if args.variant == "paired-fsdp" else args.variant
        ctx = multigpu.init(strategy=strategy, timeout=120)
    dist.barrier()
    out["rss_before"] = status("VmRSS")
    out["data_before"] = status("VmData")
    out["size_before"] = status("VmSize")
    reset_peak()
    if args.variant == "fill":
        fill(out)
        return
    net = build(args.width, args.blocks)
    if ctx is None:
        model, opt, out["strategy"] = hand_written(args.variant, net)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        model, opt = ctx.setup(net, opt)
        out["strategy"] = ctx.strategy.name
    out["peak_setup"] = status("VmHWM") - out["rss_before"]
    if args.variant == "paired-fsdp":
        paired(model, opt, ctx, args, out)
        return
    times = train_steps(model, opt, ctx, 0, args.warmup + args.steps, args)
    out["peak"] = status("VmHWM") - out["rss_before"]
    out["step_s"] = statistics.median(times[args.warmup :])
    out["steps_s"] = times


def paired(model: Any, opt: Any, ctx: Any, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """multigpu's FSDP (already set up) and a hand-written one, taking turns."""
    hand, hand_opt, _ = hand_written("fsdp-torch", build(args.width, args.blocks))
    mine: list[float] = []
    theirs: list[float] = []
    step, turn = 0, 0
    while min(len(mine), len(theirs)) < args.warmup + args.steps:
        first = (turn % 2 == 0) == (step % 2 == 0)  # alternate who goes first in a turn
        for who in ("mg", "torch") if first else ("torch", "mg"):
            if who == "mg":
                mine += train_steps(model, opt, ctx, step, args.turn, args)
            else:
                theirs += train_steps(hand, hand_opt, None, step, args.turn, args)
        step += args.turn
        turn += 1
    out["step_s"] = statistics.median(mine[args.warmup :])
    out["step_torch_s"] = statistics.median(theirs[args.warmup :])
    out["steps_s"], out["steps_torch_s"] = mine, theirs


def fill(out: dict[str, Any]) -> None:
    """64 MiB tensors until one fails: what the limit lets through (the error is the result)."""
    import torch

    held = []
    out["filled"] = 0
    while True:
        held.append(torch.ones(64 * 2**20 // 4))
        out["filled"] = len(held) * 64 * 2**20


def main() -> int:
    args = parse_args()
    if args.cap_gib:
        cap = int(args.cap_gib * GIB)
        which = resource.RLIMIT_DATA if args.cap_kind == "data" else resource.RLIMIT_AS
        resource.setrlimit(which, (cap, resource.getrlimit(which)[1]))
    if args.mmap_threshold:
        ctypes.CDLL("libc.so.6").mallopt(-3, args.mmap_threshold)  # M_MMAP_THRESHOLD
    out: dict[str, Any] = {"rank": int(os.environ["RANK"]), "variant": args.variant}
    code = 0
    try:
        run(args, out)
    except Exception as e:  # the capped case: the message is the result
        out["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400]}"
        out["peak"] = status("VmHWM") - out.get("rss_before", 0)
        out["traceback"] = traceback.format_exc()[-3000:]
        code = 1
    with open(args.out, "w") as fh:
        json.dump(out, fh)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip teardown: the other rank may be gone (capped case), and gloo's exit is slow.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
