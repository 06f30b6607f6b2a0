"""Why CPU workers run on oneTBB's allocator: the heap, the peak and the page faults per step.

Runs hand-written FSDP2 (``fully_shard`` per block, then the root) or DDP on a ``benchmarks/sizes``
model under ``torchrun --nproc-per-node 2``, once per allocator — glibc's ``malloc``, oneTBB's
(preloaded as ``multigpu run`` preloads it), and oneTBB's keeping blocks of 64 MiB and more
(``TBB_MALLOC_SET_HUGE_SIZE_THRESHOLD``, what multigpu's FSDP sets while a model is sharded) —
and prints, per step on rank 0: its time, the page faults, RSS and peak RSS, and under glibc its
heap (``mallinfo2``: the bytes in use at the step's end and at the peak between blocks, and the
heap's size, free bytes included).

    python benchmarks/allocator.py --size 50M --strategy fsdp --steps 6

Environment variables read: none (``OMP_NUM_THREADS=1`` is set for the runs).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP_64_MIB = str(64 << 20)
MALLINFO2_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                    "uordblks", "fordblks", "keepcost")  # fmt: skip
"""glibc's ``struct mallinfo2``, in order."""


def tbb_preload() -> str:
    """``LD_PRELOAD`` for oneTBB's allocator, as ``multigpu run`` sets it."""
    from multigpu.launch.cpu_allocator import tbb_libraries

    found = tbb_libraries()
    if found is None:
        raise SystemExit("oneTBB's allocator is not installed: pip install tbb")
    return ":".join(found)


def worker(size: str, strategy: str, steps: int) -> None:
    """One rank: build, wrap, train ``steps`` steps, print a line per step on rank 0."""
    import ctypes
    import time

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(HERE / "sizes"))
    from models import build

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2

    def status(field: str) -> int:
        with open("/proc/self/status") as fh:
            return next(int(ln.split()[1]) >> 10 for ln in fh if ln.startswith(field + ":"))

    def faults() -> int:
        return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[7])

    def in_use() -> int:  # MiB malloc'd (heap and mapped); zero under another allocator
        info = libc.mallinfo2()
        return (info.uordblks + info.hblkhd) >> 20

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    net, blocks, inputs = build("linear", size, dist.get_rank())
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in blocks:
            fully_shard(block, mesh=mesh)
        model: torch.nn.Module = fully_shard(net, mesh=mesh)
    else:
        model = torch.nn.parallel.DistributedDataParallel(net)
    peak = [0]

    def sample(*_: object) -> None:
        peak[0] = max(peak[0], in_use())

    for block in blocks:
        block.register_forward_hook(sample)
        block.register_full_backward_hook(sample)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(steps):
        start, before = time.perf_counter(), faults()
        model(inputs[step % len(inputs)]).square().mean().backward()
        sample()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - start) * 1e3
        heap = libc.mallinfo2().arena >> 20
        if dist.get_rank() == 0:
            print(
                f"  step {step}: {ms:7.0f} ms, {faults() - before:7d} page faults, RSS "
                f"{status('VmRSS'):5d} MiB, peak {status('VmHWM'):5d} MiB; glibc: in use "
                f"{in_use():4d} MiB (peak {peak[0]:4d}), heap {heap:5d} MiB",
                flush=True,
            )
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="50M", help="3M, 50M or 200M (a Linear stack)")
    p.add_argument("--strategy", default="fsdp", choices=("fsdp", "ddp"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.size, args.strategy, args.steps)
        return 0
    preload = tbb_preload()
    runs = {
        "glibc malloc": {},
        "oneTBB (multigpu run's default)": {"LD_PRELOAD": preload},
        "oneTBB keeping >= 64 MiB (multigpu's FSDP)": {
            "LD_PRELOAD": preload,
            "TBB_MALLOC_SET_HUGE_SIZE_THRESHOLD": KEEP_64_MIB,
        },
    }
    print(f"{args.size} linear, {args.strategy}, 2 processes (torchrun), AdamW, rank 0:")
    for name, extra in runs.items():
        print(f"{name}:", flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--standalone", __file__, "--worker", "--size", args.size, "--strategy",
               args.strategy, "--steps", str(args.steps)]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
