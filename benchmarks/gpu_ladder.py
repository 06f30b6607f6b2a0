"""The GPU ladder: a small Llama-style decoder trained through multigpu's FSDP, one speed-up
added per rung, as torchtitan's ladder — eager FSDP, + ``torch.compile`` (per block), + selective
activation checkpointing, + Float8 matmuls (torchao) — each rung's tokens/s, peak memory and MFU.

Every rung is a fresh ``multigpu.init(strategy=FSDPStrategy(activation_checkpointing=...),
precision=..., compile=...)`` Context with a fresh model (``benchmarks/gpu_ladder_model.py``:
~272M parameters on a GPU, ``--tiny`` ~0.13M for a CPU) trained with AdamW on synthetic token
batches (random tokens: a speed measurement, not a training run): ``--warmup`` steps (the first
one compiles), then ``--steps`` timed steps, the GPU synchronised only around them.

- tokens/s: the timed steps' tokens (global batch x sequence length, all ranks) per second;
- peak memory: CUDA's ``max_memory_allocated`` since the rung began, the largest rank's; on a
  CPU the process's peak RSS (``multigpu.throughput.peak_memory_bytes``), which is the peak of
  the whole process so far: rungs after the first show no less than the rungs before them;
- MFU: ``multigpu.throughput``'s FLOPs per token (6 x the matmul parameters, i.e. all but the
  token embedding, + the attention term) and its table of dense peak FLOP/s for ``--precision``
  (the Float8 rung too, against the bf16 peak, as torchtitan reports it); "n/a" on a CPU or a
  GPU the table lacks.

Float8 (``torchao.float8.convert_to_float8_training``: every Linear but the output layer,
before ``ctx.setup`` so that compile and ``fully_shard`` see the float8 layers) runs only when
torchao imports and the GPU's compute capability is 8.9 or more; otherwise its row says why not.

Time: ``--budget`` seconds for the whole ladder (the caller's window): each rung gets at most
``--rung-bound`` seconds, or an even share of what is left, and fits its timed steps into what
its warm-up left of that (at least one); a rung that starts with less than 5 % of the budget
left is skipped. Whatever happens — a compile that never ends — the process ends when the
budget does (exit code 124, one line naming the rung), the rows measured before it kept.

Results: each run is appended to the JSON list in ``--out`` (rewritten after every rung) and its
markdown table written to ``--table`` and printed. One process (``python benchmarks/gpu_ladder.py``,
no launcher needed), or every rank of ``multigpu run ... benchmarks/gpu_ladder.py`` (rank 0
writes): every rung in turn, each with its own ``multigpu.init``.

Run:  python benchmarks/gpu_ladder.py [--tiny] [--rungs eager,compile,selective,float8]
          [--budget 300] [--compile-backend inductor] [--out gpu-ladder.json]  (--help: all)

Environment variables read: none here (``multigpu.init`` reads its ``MULTIGPU_*`` ones; the
rungs pass ``compile=`` explicitly, so ``MULTIGPU_COMPILE`` does not change them).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import faulthandler
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_ladder_model as llama
import gpu_ladder_report as report

import multigpu
from multigpu import FSDPStrategy
from multigpu.throughput import (
    find_peak,
    flops_per_token,
    mfu,
    peak_flops,
    peak_memory_bytes,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rung:
    """One step of the ladder: what it adds to the rung before it."""

    name: str
    """The name ``--rungs`` takes."""
    label: str
    """The table's first column."""
    compile: bool
    """``torch.compile`` per block (``--compile-backend``)."""
    checkpointing: str | bool
    """``FSDPStrategy(activation_checkpointing=...)``."""
    float8: bool
    """torchao's Float8 training conversion of the Linear layers."""

    @property
    def row(self) -> dict[str, Any]:
        return {"rung": self.name, "label": self.label}


RUNGS = (
    Rung(name="eager", label="FSDP (eager)", compile=False, checkpointing=False, float8=False),
    Rung(name="compile", label="+ compile", compile=True, checkpointing=False, float8=False),
    Rung(
        name="selective",
        label="+ selective AC",
        compile=True,
        checkpointing="selective",
        float8=False,
    ),
    Rung(name="float8", label="+ Float8", compile=True, checkpointing="selective", float8=True),
)
MIN_SHARE = 0.05  # a rung starting with less than this share of the budget left is skipped


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="the CPU-sized model (seconds a rung)")
    p.add_argument(
        "--rungs",
        default=",".join(r.name for r in RUNGS),
        help="comma list, in ladder order (default: all four)",
    )
    p.add_argument("--budget", type=float, default=300.0, help="seconds for the whole ladder")
    p.add_argument(
        "--rung-bound",
        type=float,
        default=None,
        help="seconds per rung at most (default: an even share of what is left)",
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps (10; --tiny 5)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (3; --tiny 2)")
    p.add_argument(
        "--batch", type=int, default=None, help="global batch in sequences (8; --tiny 4)"
    )
    p.add_argument(
        "--precision",
        default=None,
        help="multigpu.init's (bf16-mixed on a GPU; 32 on a CPU, whose bf16 matmuls "
        "this machine kind emulates at a quarter of the speed)",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="the compiled rungs' torch.compile backend (aot_eager: no C++ compile)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cuda", "cpu"),
        help="multigpu.init's accelerator (auto: CUDA when present)",
    )
    p.add_argument("--out", default="gpu-ladder.json", help="the JSON list each run joins")
    p.add_argument("--table", default=None, help="the markdown table (default: --out's .md)")
    args = p.parse_args(argv)
    names = [n for n in args.rungs.split(",") if n]
    known = [r.name for r in RUNGS]
    if not names or any(n not in known for n in names):
        p.error(f"--rungs {args.rungs!r}: expected a comma list of {', '.join(known)}")
    args.rungs = [r for r in RUNGS if r.name in names]
    for flag, value in (
        ("--budget", args.budget),
        ("--rung-bound", args.rung_bound),
        ("--steps", args.steps),
        ("--warmup", args.warmup),
        ("--batch", args.batch),
    ):
        if value is not None and value <= 0:
            p.error(f"{flag} {value}: expected a positive number")
    args.steps = args.steps or (5 if args.tiny else 10)
    args.warmup = args.warmup or (2 if args.tiny else 3)
    args.batch = args.batch or (4 if args.tiny else 8)
    args.table = args.table or str(Path(args.out).with_suffix(".md"))
    return args


def float8_unavailable(device: torch.device) -> str | None:
    """Why the Float8 rung cannot run here, or None when it can."""
    if device.type != "cuda":
        return "no CUDA device (Float8 matmuls need a GPU of compute capability >= 8.9)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"compute capability {major}.{minor} < 8.9 (Float8 matmuls need Ada or Hopper)"
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        return f"torchao does not import ({e}); pip install torchao"
    return None


def to_float8(model: torch.nn.Module) -> None:
    """torchao's Float8 training conversion, in place: every Linear but the output layer whose
    dims divide by 16 (the float8 matmul's rule; torchtitan leaves the output layer too)."""
    from torchao.float8 import convert_to_float8_training

    def wanted(module: torch.nn.Module, fqn: str) -> bool:
        if fqn == "output":
            return False
        if isinstance(module, torch.nn.Linear):
            return module.in_features % 16 == 0 and module.out_features % 16 == 0
        return True

    convert_to_float8_training(model, module_filter_fn=wanted)


def run_rung(rung: Rung, args: argparse.Namespace, bound: float) -> dict[str, Any]:
    """One rung in a Context of its own: its row of the table (see the module doc)."""
    start = time.perf_counter()
    soft_end = start + bound
    torch.compiler.reset()  # each compiled rung pays (and reports) its own compile
    config = llama.TINY if args.tiny else llama.GPU
    strategy = FSDPStrategy(activation_checkpointing=rung.checkpointing)
    with multigpu.init(
        strategy=strategy,
        precision=args.precision,
        accelerator=args.device,
        compile=args.compile_backend if rung.compile else False,
        seed=0,
    ) as ctx:
        cuda = ctx.device.type == "cuda"
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(ctx.device)
        with torch.device(ctx.device):  # built where it trains (272M on a GPU: no CPU copy)
            model = llama.Llama(config)
        per_token = flops_per_token(
            llama.matmul_parameters(model),
            layers=config.layers,
            width=config.dim,
            seq_len=config.seq_len,
        )
        if rung.float8:  # before setup: compile and fully_shard see the float8 layers
            to_float8(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        model, optimizer = ctx.setup(model, optimizer)
        if args.batch % ctx.world_size:
            raise SystemExit(
                f"--batch {args.batch}: expected a multiple of the {ctx.world_size} ranks"
            )
        local = args.batch // ctx.world_size
        generator = torch.Generator(device=ctx.device).manual_seed(1000 + ctx.rank)

        def step() -> torch.Tensor:
            tokens = torch.randint(
                config.vocab, (local, config.seq_len + 1), device=ctx.device, generator=generator
            )
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            ctx.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        def synced() -> float:
            if cuda:
                torch.cuda.synchronize(ctx.device)
            return time.perf_counter()

        warm: list[float] = []
        for _ in range(args.warmup):
            began = synced()
            step()
            warm.append(synced() - began)
            if ctx.all_reduce(float(time.perf_counter() > soft_end), op="max"):
                break  # past the rung's bound: time what is left of it (one step at least)
        left = soft_end - time.perf_counter()
        fits = min(args.steps, max(1, math.floor(left / warm[-1]))) if left > 0 else 1
        steps = int(ctx.all_reduce(float(fits), op="min"))  # every rank the same count
        began = synced()
        for _ in range(steps):
            loss = step()
        seconds = synced() - began
        tokens_per_s = steps * args.batch * config.seq_len / seconds
        peak = int(ctx.all_reduce(float(peak_memory_bytes(ctx.device)), op="max"))
        row: dict[str, Any] = {
            **rung.row,
            "status": "ok",
            "compile": args.compile_backend if rung.compile else None,
            "activation_checkpointing": rung.checkpointing or None,
            "float8": rung.float8,
            "warmup_steps": len(warm),
            "first_step_s": warm[0],
            "steps": steps,
            "step_s": seconds / steps,
            "tokens_per_s": tokens_per_s,
            "peak_memory_bytes": peak,
            "peak_memory_of": "cuda max_memory_allocated" if cuda else "process max RSS",
            "mfu": rung_mfu(ctx.device, tokens_per_s, per_token, args.precision, ctx.world_size),
            "loss": ctx.all_reduce(float(loss)),
            "world_size": ctx.world_size,
            "device": torch.cuda.get_device_name(ctx.device) if cuda else "cpu",
            "flops_per_token": per_token,
            "bound_s": bound,
        }
        if steps < args.steps:
            row["status"] = f"ok: {steps} of {args.steps} timed steps fitted the rung's bound"
    row["rung_s"] = time.perf_counter() - start
    return row


def rung_mfu(
    device: torch.device, tokens_per_s: float, per_token: float, precision: str, devices: int
) -> float | None:
    """MFU against multigpu's table of dense peaks; None on a CPU or a GPU it lacks."""
    if device.type != "cuda":
        return None
    found = find_peak(torch.cuda.get_device_name(device))
    if found is None:
        return None
    tf32 = torch.get_float32_matmul_precision() != "highest"
    return mfu(tokens_per_s, per_token, peak_flops(found, precision, tf32_allowed=tf32), devices)


def stop_at(deadline: float, budget: float, where: dict[str, str]) -> None:
    """End the process at ``deadline`` whatever it is doing (a compile that never ends): one line
    naming the rung, its stack, exit code 124 — the rows measured before it are on disk."""

    def fire() -> None:
        print(
            f"gpu_ladder: the budget of {budget:.0f} s ended during rung {where['rung']}; "
            "the rows before it are saved",
            flush=True,
        )
        faulthandler.dump_traceback(all_threads=False)
        os._exit(124)

    timer = threading.Timer(max(0.0, deadline - time.perf_counter()), fire)
    timer.daemon = True
    timer.start()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    deadline = began + args.budget
    where = {"rung": "(start-up)"}
    stop_at(deadline, args.budget, where)
    config = llama.TINY if args.tiny else llama.GPU
    main_rank = os.environ.get("RANK", "0") == "0"
    earlier = report.earlier_runs(Path(args.out)) if main_rank else []
    if earlier is None:
        print(
            f"gpu_ladder: --out {args.out} is not a JSON list of earlier ladders; expected "
            "such a list or no file: give another --out",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    args.precision = args.precision or ("bf16-mixed" if device.type == "cuda" else "32")
    with torch.device("meta"):  # counted, not allocated
        meta_model = llama.Llama(config)
    record: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]) if argv is None else " ".join(argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "torch": torch.__version__,
        "model": "Llama-style, tiny" if args.tiny else "Llama-style",
        "parameters": sum(p.numel() for p in meta_model.parameters()),
        "config": dataclasses.asdict(config),
        "global_batch": args.batch,
        "precision": args.precision,
        "compile_backend": args.compile_backend,
        "budget_s": args.budget,
        "rows": [],
    }
    why_not = {r.name: float8_unavailable(device) for r in args.rungs if r.float8}
    runnable = [r for r in args.rungs if not why_not.get(r.name)]
    for rung in args.rungs:
        left = deadline - time.perf_counter()
        if why_not.get(rung.name):
            row = {**rung.row, "status": f"skipped: {why_not[rung.name]}"}
        elif left < MIN_SHARE * args.budget:
            row = {**rung.row, "status": f"skipped: the budget is spent ({left:.0f} s left)"}
        else:
            share = left / (len(runnable) - runnable.index(rung))
            where["rung"] = rung.name
            row = run_rung(rung, args, min(share, args.rung_bound or share))
        if main_rank:
            print(report.line(row), flush=True)
        record["rows"].append(row)
        if main_rank:  # every rung rewrites the files whole: a hard stop keeps the rows before
            report.save(record, earlier, Path(args.out), Path(args.table))
    where["rung"] = "(the end)"
    if main_rank:
        print("\n" + report.table(record), end="")
        print(f"gpu_ladder: {time.perf_counter() - began:.1f} s; {args.out}, {args.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
