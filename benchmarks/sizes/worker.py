"""One rank of one ``benchmarks/sizes.py`` run: build, wrap, train, report step times and memory.

Started by ``torchrun --nproc-per-node 2`` (the hand-written variants) or ``multigpu run --cpu 2``
(multigpu's), with ``OMP_NUM_THREADS=1``. Writes one JSON object per rank into ``--out-dir``.

Variants:
  ddp-torch   hand-written: ``init_process_group("gloo")`` + ``DistributedDataParallel``
  fsdp-torch  hand-written: ``fully_shard`` on each block, then the root (torch's FSDP2 example)
  ddp / fsdp  ``multigpu.init(strategy=...)``, ``ctx.setup``, ``ctx.backward``, ``ctx.step``

Both loops do the same work per step: forward on a pre-made batch, ``square().mean()``, backward,
``AdamW.step()``, ``zero_grad(set_to_none=True)``. A step's time is the wall time from the end of
the previous step to the end of this one on each rank.

Besides step times each rank reports: the peak RSS of the process (``VmHWM``, bytes), the CPU
time every thread of the process spent during the timed steps (``/proc/self/task/*/stat``, by
thread name: the step's own thread, gloo's, multigpu's), and the garbage collections and their
time during the timed steps (``gc.callbacks``).

Environment variables read: what ``init_process_group`` / ``multigpu.init`` read.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from models import build


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", required=True, choices=("ddp-torch", "fsdp-torch", "ddp", "fsdp"))
    p.add_argument("--kind", required=True)
    p.add_argument("--size", required=True)
    p.add_argument("--steps", type=int, required=True, help="timed steps")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out-dir", required=True)
    return p.parse_args()


def status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmHWM``, ``VmRSS``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of every thread of this process, keyed ``name/tid``: the
    main thread ``main``, Python's threads by their ``threading`` name, others by the kernel's
    (gloo's ``gloo_tcp_loop``, ``pt_gloo_runloop``); ``minor-faults`` counts the process's."""
    tick = os.sysconf("SC_CLK_TCK")
    python = {t.native_id: t.name for t in threading.enumerate()}
    python[os.getpid()] = "main"
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name = python.get(int(task.name)) or stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / tick
    stat = Path("/proc/self/stat").read_text()
    out["minor-faults/0"] = int(stat[stat.rindex(")") + 2 :].split()[7])
    return out


def allocator() -> str:
    """``tbbmalloc`` when oneTBB's allocator replaced ``malloc`` in this process (``multigpu
    run`` preloads it into CPU workers), else ``glibc``."""
    with open("/proc/self/maps") as fh:
        return "tbbmalloc" if "libtbbmalloc_proxy" in fh.read() else "glibc"


class GcClock:
    """Collections and their wall time while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.count, self.seconds, self._start = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._start


def wrap(variant: str, net: torch.nn.Module, blocks: list[torch.nn.Module]) -> tuple[Any, Any]:
    """The hand-written set-ups: DDP, or ``fully_shard`` per block then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    if variant == "ddp-torch":
        model: Any = DistributedDataParallel(net)
    else:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in blocks:
            fully_shard(block, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    ctx: Any = None
    if args.variant.endswith("-torch"):
        dist.init_process_group("gloo")
    else:
        import multigpu

        ctx = multigpu.init(strategy=args.variant)
    rank = dist.get_rank()
    net, blocks, inputs = build(args.kind, args.size, rank)
    if ctx is None:
        model, opt = wrap(args.variant, net, blocks)
    else:
        model, opt = ctx.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-4))
    params = sum(p.numel() for p in net.parameters())
    times: list[float] = []
    clock = GcClock()
    before: dict[str, float] = {}
    last = time.perf_counter()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            before = thread_cpu()
            gc.callbacks.append(clock)
            cpu0 = time.process_time()
            sys0 = os.times().system
        loss = model(inputs[step % len(inputs)]).square().mean()
        if ctx is None:
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            ctx.backward(loss)
            ctx.step(opt)
        now = time.perf_counter()
        if step >= args.warmup:
            times.append(now - last)
        last = now
    cpu = time.process_time() - cpu0
    system = os.times().system - sys0
    gc.callbacks.remove(clock)
    after = thread_cpu()
    threads = {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}
    report = {
        "rank": rank,
        "variant": args.variant,
        "params": params,
        "step_s": statistics.median(times),
        "steps_s": times,
        "cpu_per_step_s": cpu / args.steps,
        "system_per_step_s": system / args.steps,
        "peak_rss": status("VmHWM"),
        "threads": {k: v for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0},
        "gc": {"count": clock.count, "seconds": clock.seconds},
        "loss": float(loss.detach()),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "allocator": allocator(),
    }
    Path(args.out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    if ctx is None:
        del model, opt, net, blocks
        gc.collect()  # torch 2.13's exit deadlock: DDP freed before the group (DESIGN.md)
        dist.destroy_process_group()
    else:
        del model, opt
        ctx.teardown()


if __name__ == "__main__":
    main()
