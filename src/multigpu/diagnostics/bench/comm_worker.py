"""The worker of ``multigpu bench comm``: every rank times each collective at each size.

Started by ``multigpu bench comm`` through the launcher (``python -m multigpu run --cpu N -m
multigpu.diagnostics.bench.comm_worker --out FILE ...``, or ``--gpus N``). It uses plain
``torch.distributed``, not ``multigpu.init()``: the collectives are measured without multigpu's
hang recorder (a Python wrapper per call), the way nccl-tests measures NCCL alone.

For each collective and size: one call on known values checks the result, ``--warmup`` calls
are not timed, then after a barrier ``--iters`` calls are timed back to back (ending with a
``torch.cuda.synchronize`` on GPUs); each rank's mean time is reduced with MAX, so the time
reported is the slowest rank's. Rank 0 writes the results as JSON to ``--out``.

torch 2.13's gloo has no reduce-scatter algorithm of its own: ``ProcessGroupGloo`` runs it as an
all-reduce of the whole input and keeps this rank's slice (``reduce_scatter_tensor_coalesced``
in its source); the rows say so.

Environment variables read besides torchrun's: ``MULTIGPU_DEVICE`` (``cpu``: stay on the CPU),
``MULTIGPU_TIMEOUT`` (seconds a collective may wait, default 300).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from multigpu.diagnostics.bench.bandwidth import Shape, algbw_gbps, busbw_gbps, shape_for
from multigpu.diagnostics.bench.sizes import parse_ops, parse_sizes

GLOO_REDUCE_SCATTER = (
    "gloo: an all-reduce of the whole input, then this rank's slice (torch's ProcessGroupGloo "
    "has no reduce-scatter algorithm)"
)

Collective = Callable[[torch.Tensor, torch.Tensor], object]

# torch 2.13 deprecates the *_tensor names for *_single; older torch has only the former.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


COLLECTIVES: dict[str, Collective] = {
    "all_reduce": lambda inp, _out: dist.all_reduce(inp),
    "broadcast": lambda inp, _out: dist.broadcast(inp, src=0),
    "all_gather": lambda inp, out: _all_gather(out, inp),
    "reduce_scatter": lambda inp, out: _reduce_scatter(out, inp),
}
"""``fn(input, output)`` running each collective (broadcast from rank 0; reductions are sums)."""


def expected_output(op: str, shape: Shape, rank: int, world_size: int) -> torch.Tensor:
    """What ``op`` must leave in the output when every rank's input holds ``rank + 1``."""
    total = world_size * (world_size + 1) / 2
    if op in ("all_reduce", "reduce_scatter"):
        return torch.full((shape.output_numel,), total)
    if op == "broadcast":
        return torch.ones(shape.output_numel)
    ranks = torch.arange(1, world_size + 1, dtype=torch.float32)
    return ranks.repeat_interleave(shape.input_numel)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    op: str, shape: Shape, *, iters: int, warmup: int, device: torch.device
) -> tuple[float, bool]:
    """(this rank's mean seconds per call, whether the checked call gave the right values)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    run = COLLECTIVES[op]
    inp = torch.full((shape.input_numel,), float(rank + 1), device=device)
    out = torch.empty(shape.output_numel, device=device)
    run(inp, out)
    result = inp if op in ("all_reduce", "broadcast") else out
    correct = torch.equal(result.cpu(), expected_output(op, shape, rank, world_size))
    inp.zero_()  # repeated in-place sums of zeros never overflow, whatever --iters
    for _ in range(warmup):
        run(inp, out)
    _sync(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        run(inp, out)
    _sync(device)
    return (time.perf_counter() - started) / iters, correct


def sweep(
    ops: Sequence[str], sizes: Sequence[int], *, iters: int, warmup: int, device: torch.device
) -> list[dict[str, Any]]:
    """Measure every collective at every size; rows as in the JSON (the same on every rank)."""
    world_size = dist.get_world_size()
    rows: list[dict[str, Any]] = []
    for op in ops:
        for requested in sizes:
            shape = shape_for(op, requested, world_size)
            if shape is None:
                continue  # below one float32 per rank: nothing to move
            seconds, correct = measure(op, shape, iters=iters, warmup=warmup, device=device)
            # The slowest rank's mean, and whether any rank saw a wrong value.
            stats = torch.tensor([seconds, 0.0 if correct else 1.0], dtype=torch.float64)
            stats = stats.to(device)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            slowest, wrong = float(stats[0]), bool(stats[1] > 0)
            rows.append(
                {
                    "op": op,
                    "size_bytes": shape.size_bytes,
                    "requested_bytes": requested,
                    "count": shape.size_bytes // 4,
                    "time_us": slowest * 1e6,
                    "algbw_gbps": algbw_gbps(shape.size_bytes, slowest),
                    "busbw_gbps": busbw_gbps(op, shape.size_bytes, slowest, world_size),
                    "correct": not wrong,
                }
            )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Run the sweep in this worker; rank 0 writes ``--out``."""
    p = argparse.ArgumentParser(prog="python -m multigpu.diagnostics.bench.comm_worker")
    p.add_argument("--out", type=Path, required=True, help="rank 0 writes the JSON here")
    p.add_argument("--sizes", type=parse_sizes, required=True)
    p.add_argument("--ops", type=parse_ops, required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    use_cuda = os.environ.get("MULTIGPU_DEVICE") != "cpu" and torch.cuda.is_available()
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    timeout = timedelta(seconds=float(os.environ.get("MULTIGPU_TIMEOUT") or 300))
    dist.init_process_group(backend, timeout=timeout)
    try:
        rows = sweep(args.ops, args.sizes, iters=args.iters, warmup=args.warmup, device=device)
        if dist.get_rank() == 0:
            notes = {"reduce_scatter": GLOO_REDUCE_SCATTER} if backend == "gloo" else {}
            document = {
                "world_size": dist.get_world_size(),
                "backend": backend,
                "device": torch.cuda.get_device_name(device) if use_cuda else "cpu",
                "dtype": "float32",
                "iters": args.iters,
                "warmup": args.warmup,
                "torch": torch.__version__,
                "notes": notes,
                "rows": rows,
            }
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(document, indent=2) + "\n")
            tmp.replace(args.out)  # the launcher's parent never reads half a file
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
