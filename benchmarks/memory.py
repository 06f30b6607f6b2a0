"""Peak memory and step time of DDP vs FSDP on 2 CPU processes, and the memory estimate's error.

The model: ``nn.Sequential`` of Linear+ReLU blocks at two sizes (``50M``: 12 blocks of 2048
features, 50.4M parameters; ``200M``: 12 blocks of 4096, 201.4M), AdamW, a batch of 8 rows per
rank, gloo, one thread per process. Every run is a fresh pair of processes (peak RSS is per
process): ``benchmarks/memory/worker.py`` measures, on each rank, the peak RSS growth (``VmHWM``
after the steps minus ``VmRSS`` before the model was built) and the median step time.

Sections (interleaved where they compare: the order of the variants rotates every round, and
every ratio is against a baseline measured in the same run, as the machine is noisy):

1. ``sizes``: hand-written DDP and ``fully_shard`` (torch only) against multigpu's ``ddp``,
   ``fsdp`` and ``auto`` (``multigpu.init(strategy=...)`` + ``ctx.setup``), with
   ``multigpu.estimate_memory``'s figure for the same model and its error;
2. ``paired``: multigpu's FSDP and a hand-written ``fully_shard`` in the same two processes,
   taking turns every 2 steps: step time only, the fairest comparison here;
3. ``capped``: the large model under ``RLIMIT_DATA`` (``--cap-gib``, 3 GiB) per process: DDP
   must fail with an exception (not a kill), FSDP train, ``auto`` choose FSDP;
4. ``allocator``: hand-written DDP and FSDP again with glibc's ``M_MMAP_THRESHOLD`` fixed at
   128 KiB (freed tensors go back to the OS at once), to show how much of the peak RSS is freed
   memory glibc keeps in its heaps — the estimate counts live tensors only;
5. ``limits``: no model, 64 MiB tensors until one fails under ``RLIMIT_DATA`` and under
   ``RLIMIT_AS`` (``--cap-gib``): which limit a torch+gloo process can be capped with, and
   that going over it is a Python exception.

Run:  python benchmarks/memory.py [--rounds 2] [--sections sizes,paired,capped,allocator,limits]
                                  [--markdown out.md] [--json out.json]

Environment variables read: none (the workers' are set in benchmarks/memory/runner.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "memory"))

import report  # noqa: E402
import runner  # noqa: E402

SIZES = {"50M": (2048, 12), "200M": (4096, 12)}
VARIANTS = ("ddp-torch", "fsdp-torch", "ddp", "fsdp", "auto")
SECTIONS = ("sizes", "paired", "capped", "allocator", "limits")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="runs of each variant per size (2)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per run (4)")
    p.add_argument("--sizes", default="50M,200M", help="comma list of 50M, 200M")
    p.add_argument("--variants", default=",".join(VARIANTS), help="section sizes: which")
    p.add_argument("--sections", default=",".join(SECTIONS), help=", ".join(SECTIONS))
    p.add_argument("--paired-steps", type=int, default=6, help="paired: timed steps of each (6)")
    p.add_argument("--cap-gib", type=float, default=3.0, help="capped: RLIMIT_DATA (3 GiB)")
    p.add_argument("--json", help="write every run's reports here")
    p.add_argument("--markdown", help="write the tables here (for benchmarks/RESULTS.md)")
    return p.parse_args(argv)


def estimates(sizes: list[str]) -> dict[str, dict[str, int]]:
    """``multigpu.estimate_memory`` of each size on 2 processes (ddp and fsdp, bytes)."""
    import torch
    from torch import nn

    from multigpu.estimate import estimate_memory

    out = {}
    for size in sizes:
        width, blocks = SIZES[size]
        with torch.device("meta"):
            net = nn.Sequential(
                *(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks))
            )
        est = estimate_memory(net, world_size=2, optimizer="adamw")
        out[size] = {"ddp": est.of("ddp").total, "fsdp": est.of("fsdp").total,
                     "parameters": est.parameters}  # fmt: skip
    return out


def measure(run: runner.Run, label: str, log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    start = time.monotonic()
    ranks = runner.launch(run)
    wall = time.monotonic() - start
    log.append({"label": label, "run": run.__dict__, "ranks": ranks, "wall_s": wall})
    peak = max(r.get("peak", 0) for r in ranks) / 2**30
    step = statistics.median([r["step_s"] for r in ranks if "step_s" in r] or [float("nan")])
    error = next((r["error"] for r in ranks if "error" in r), "")
    print(
        f"  {label:<28} {run.variant:<11} peak {peak:5.2f} GiB  step {step * 1e3:8.1f} ms  "
        f"{wall:5.1f} s {error[:90]}",
        flush=True,
    )
    return ranks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sizes if s not in SIZES] + [v for v in variants if v not in VARIANTS]
    bad += [s for s in sections if s not in SECTIONS]
    if bad:
        raise SystemExit(f"unknown size, variant or section: {', '.join(bad)}")
    large = sizes[-1]
    log: list[dict[str, Any]] = []
    results: dict[str, Any] = {"estimates": estimates(sizes), "sizes": {}, "paired": [],
                               "capped": {}, "allocator": {}, "limits": {}}  # fmt: skip
    print(f"memory benchmark: {platform.python_version()}, sections {', '.join(sections)}")
    if "sizes" in sections:
        for round_ in range(args.rounds):
            for size in sizes:
                width, blocks = SIZES[size]
                shift = round_ % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    run = runner.Run(variant=variant, width=width, blocks=blocks, steps=args.steps)
                    ranks = measure(run, f"{size} round {round_ + 1}", log)
                    results["sizes"].setdefault(size, {}).setdefault(variant, []).append(ranks)
    if "paired" in sections:
        width, blocks = SIZES[large]
        for round_ in range(args.rounds):
            run = runner.Run(variant="paired-fsdp", width=width, blocks=blocks,
                             steps=args.paired_steps)  # fmt: skip
            results["paired"].append(measure(run, f"{large} paired {round_ + 1}", log))
    if "capped" in sections:
        width, blocks = SIZES[large]
        for variant in ("ddp-torch", "ddp", "fsdp-torch", "fsdp", "auto"):
            run = runner.Run(variant=variant, width=width, blocks=blocks, steps=2,
                             cap_gib=args.cap_gib)  # fmt: skip
            results["capped"][variant] = measure(run, f"{large} capped {args.cap_gib} GiB", log)
    if "allocator" in sections:
        for size in sizes:
            width, blocks = SIZES[size]
            for variant in ("ddp-torch", "fsdp-torch"):
                run = runner.Run(variant=variant, width=width, blocks=blocks, steps=args.steps,
                                 mmap_threshold=128 * 1024)  # fmt: skip
                ranks = measure(run, f"{size} mmap 128K", log)
                results["allocator"].setdefault(size, {})[variant] = ranks
    if "limits" in sections:
        for kind in ("data", "as"):
            run = runner.Run(variant="fill", width=1, blocks=1, cap_gib=args.cap_gib,
                             cap_kind=kind)  # fmt: skip
            results["limits"][kind] = measure(run, f"fill under {args.cap_gib} GiB", log)
    text = report.markdown(results, args)
    print()
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "log": log}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
