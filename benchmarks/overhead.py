"""multigpu's overhead against hand-written DDP, HuggingFace Accelerate and Lightning Fabric.

Five measurements, each with interleaved repetitions in one run (a, b, c, d, then b, c, d, a,
...: the order rotates each round) so the noise of a shared machine hits every contender alike;
figures are medians:

1. Per-step time of the same model, data, global batch and seed on 2 CPU processes (gloo, one
   thread each) through (a) torchrun + hand-written DDP, (b) ``multigpu run --cpu 2``,
   (c) Accelerate and (d) Fabric under torchrun. Each worker times its own steps after a
   warm-up; the table also shows the loss after the last step, which must agree (same global
   batches, same initial weights), and the time from launch to the first step.
2. The same, in one run: the four train side by side in the same two processes, taking turns
   in blocks of 10 steps (benchmarks/overhead/paired.py), so the machine's noise cancels much
   better than between separate runs; with them hand-written DDP with only ``ctx.loader`` or
   only ``ctx.backward`` swapped in, and the main thread's CPU time per step, which resolves
   multigpu's own work in place (tens of microseconds).
3. The work multigpu adds per step, piece by piece in one process in a tight loop (loader,
   backward, the hang recorder: benchmarks/overhead/extra_work.py), as a share of the DDP step
   time above: a lower bound, as the code runs with hot caches there.
4. Time to ``import`` torch, multigpu, accelerate and lightning.fabric, each in a fresh
   interpreter.
5. Launch to first step: ``multigpu run --cpu 2 script`` against ``torchrun --nproc-per-node 2
   script``, from starting the command to rank 0's first optimizer step.

Targets (issue 6): per-step overhead <= 1 % over hand-written DDP; ``import multigpu`` <=
``import torch`` + 0.1 s; launch to first step <= torchrun's + 0.5 s.

Setup once:  bash benchmarks/setup_anchors.sh       (benchmarks/.venv-anchors, torch 2.13.0)
Run:         python benchmarks/overhead.py [--reps 5] [--steps 200] [--json out.json]

Run with any interpreter: without accelerate and lightning it re-runs itself with
``benchmarks/.venv-anchors/bin/python``. Environment variables read: none (the children's
environment is described in benchmarks/overhead/measure.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
ANCHORS_PYTHON = HERE / ".venv-anchors" / "bin" / "python"
sys.path.insert(0, str(HERE / "overhead"))

import measure  # noqa: E402
import report  # noqa: E402

T = TypeVar("T")
SECTIONS = ("step", "paired", "extra", "import", "launch")


def ensure_anchors() -> None:
    """Re-run this script with the anchors' interpreter when this one lacks a contender."""
    if all(importlib.util.find_spec(m) for m in ("accelerate", "lightning", "multigpu")):
        return
    if ANCHORS_PYTHON.exists() and Path(sys.executable) != ANCHORS_PYTHON:
        os.execv(ANCHORS_PYTHON, [str(ANCHORS_PYTHON), __file__, *sys.argv[1:]])
    raise SystemExit(
        f"{sys.executable} has no accelerate/lightning/multigpu and {ANCHORS_PYTHON} does not "
        "exist; run `bash benchmarks/setup_anchors.sh` first"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, help="runs of each framework per model (5)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per run (200)")
    p.add_argument("--warmup", type=int, default=20, help="first steps not timed (20)")
    p.add_argument("--batch", type=int, default=64, help="GLOBAL batch per step (64)")
    p.add_argument("--models", default="mlp,cnn", help="comma list of mlp, cnn (mlp,cnn)")
    p.add_argument(
        "--paired-steps", type=int, default=400, help="steps of each framework, paired run (400)"
    )
    p.add_argument("--block", type=int, default=10, help="steps per turn in the paired run (10)")
    p.add_argument("--import-reps", type=int, default=15, help="imports of each module (15)")
    p.add_argument("--launch-reps", type=int, default=5, help="launches of each command (5)")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma list of sections (all)")
    p.add_argument("--json", help="also write every measurement to this file")
    args = p.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    args.models = [m for m in args.models.split(",") if m]
    if not set(args.only) <= set(SECTIONS) or not set(args.models) <= {"mlp", "cnn"}:
        p.error(f"--only takes {', '.join(SECTIONS)}; --models takes mlp, cnn")
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    return args


def bench_steps(args: argparse.Namespace, model: str) -> dict[str, list[dict[str, Any]]]:
    """Per-step time of the four frameworks on ``model``, ``args.reps`` interleaved rounds."""
    settings = {
        "BENCH_MODEL": model,
        "BENCH_STEPS": str(args.steps),
        "BENCH_WARMUP": str(args.warmup),
        "BENCH_BATCH": str(args.batch),
        "BENCH_SEED": "0",
    }
    runs: dict[str, list[dict[str, Any]]] = {job.key: [] for job in measure.STEP_JOBS}
    for rep in range(args.reps):
        for job in rotated(measure.STEP_JOBS, rep):
            result = measure.run_job(job, settings)
            runs[job.key].append(result)
            progress(
                f"{model} rep {rep + 1}/{args.reps} {job.key}: "
                f"{result['step_median_s'] * 1e3:.2f} ms/step, loss {result['final_loss']:.7f}"
            )
    return runs


def bench_paired(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """The four frameworks taking turns in the same processes (benchmarks/overhead/paired.py)."""
    settings = {
        "BENCH_MODEL": model,
        "BENCH_STEPS": str(args.paired_steps),
        "BENCH_WARMUP": str(args.warmup),
        "BENCH_BATCH": str(args.batch),
        "BENCH_SEED": "0",
        "BENCH_BLOCK": str(args.block),
    }
    result, started, ended = measure.launch(measure.PAIRED_JOB, settings)
    progress(f"{model} paired: {ended - started:.0f} s")
    return result


def bench_imports(args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    """Import times, interleaved, after one untimed round (fills the page and bytecode caches)."""
    for module in measure.IMPORTS:
        measure.time_import(module)
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in measure.IMPORTS}
    for rep in range(args.import_reps):
        for module in rotated(measure.IMPORTS, rep):
            times[module].append(measure.time_import(module))
        progress(f"imports rep {rep + 1}/{args.import_reps}")
    return times


def bench_launch(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Launch to first step of each launch command, interleaved (2 steps of the CNN each)."""
    settings = {"BENCH_MODEL": "cnn", "BENCH_STEPS": "2", "BENCH_WARMUP": "0", "BENCH_SEED": "0"}
    keys = ("launch_s", "to_worker_s", "worker_setup_s", "cpu_total_s")
    times: dict[str, dict[str, list[float]]] = {
        job.key: {k: [] for k in keys} for job in measure.LAUNCH_JOBS
    }
    for rep in range(args.launch_reps):
        for job in rotated(measure.LAUNCH_JOBS, rep):
            result = measure.run_job(job, settings)
            for k in keys:
                times[job.key][k].append(result[k])
        progress(f"launch rep {rep + 1}/{args.launch_reps}")
    return times


def rotated(items: Sequence[T], rnd: int) -> list[T]:
    """``items`` starting one further along each round, so no contender always follows another.

    Example:
        >>> rotated("abcd", 1)
        ['b', 'c', 'd', 'a']
    """
    k = rnd % len(items)
    return [*items[k:], *items[:k]]


def progress(line: str) -> None:
    """One progress line on stderr (the tables go to stdout)."""
    print(f"  [{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections and print their tables; 0 (targets are reported, not enforced)."""
    ensure_anchors()
    args = parse_args(argv)
    data: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/overhead.py", *sys.argv[1:]]),
        "versions": measure.versions(),
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
    }
    print(report.header(data))
    if "step" in args.only:
        data["step"] = {}
        for model in args.models:
            data["step"][model] = bench_steps(args, model)
            print(report.step_table(model, data["step"][model], args), flush=True)
    if "paired" in args.only:
        data["paired"] = {}
        for model in args.models:
            data["paired"][model] = bench_paired(args, model)
            print(report.paired_table(model, data["paired"][model]), flush=True)
    if "extra" in args.only:
        data["extra"] = {}
        for model in args.models:
            settings = {"BENCH_MODEL": model, "BENCH_BATCH": str(args.batch)}
            data["extra"][model] = measure.extra_work(settings)
            progress(f"{model} extra work measured")
        print(report.extra_table(data["extra"], data), flush=True)
    if "import" in args.only:
        data["import"] = bench_imports(args)
        print(report.import_table(data["import"]), flush=True)
    if "launch" in args.only:
        data["launch"] = bench_launch(args)
        print(report.launch_table(data["launch"]), flush=True)
    data["load_after"] = os.getloadavg()
    print(report.verdicts(data))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
        print(f"measurements written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
