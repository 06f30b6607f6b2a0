"""multigpu's ddp and fsdp against hand-written DDP and ``fully_shard`` at three model sizes.

For each size (about 3M, 50M and 200M parameters) and kind (a stack of Linear layers, a small
transformer: ``benchmarks/sizes/models.py``), AdamW, on 2 CPU processes (gloo, one thread
each), this runs pairs of separate runs — hand-written then multigpu, then multigpu then
hand-written, and so on — for DDP and for FSDP:

- hand-written: ``torchrun --nproc-per-node 2 benchmarks/sizes/worker.py --variant ddp-torch``
  (``DistributedDataParallel``) or ``fsdp-torch`` (``fully_shard`` per block, then the root, as
  torch's FSDP2 example);
- multigpu: ``multigpu run --cpu 2 benchmarks/sizes/worker.py --variant ddp`` or ``fsdp``
  (``multigpu.init(strategy=...)``, ``ctx.setup``, ``ctx.backward``, ``ctx.step``).

Separate processes taking turns, so whatever multigpu adds to the whole process (its threads,
its launcher's environment) is measured, and the machine's drift falls on both sides alike.

Per size, kind and strategy it prints: the median step time of each side (the median over the
runs of each run's median step, rank 0), the ratio multigpu / hand-written as the median of the
pairs' ratios with their min-max, and the peak RSS per rank (``VmHWM``, the larger rank) of each
side. ``--threads`` adds, per variant, the CPU time per step of every thread (by name) during
the timed steps, and the garbage collections: what runs beside the step.

Run:  python benchmarks/sizes.py [--sizes 3M,50M,200M] [--kinds linear,transformer]
          [--strategies ddp,fsdp] [--pairs 5] [--steps 3M=30,50M=12,200M=6] [--warmup 2]
          [--threads] [--json out.json] [--hand-allocator system|tbb]

``--hand-allocator tbb`` runs the hand-written side on oneTBB's allocator too (``LD_PRELOAD``,
as ``multigpu run`` sets it for CPU workers): the ratio then says what multigpu adds beyond the
allocator; the default (glibc's) is torchrun as users run it.

Measured on 2 busy cores: ``--sizes 50M --kinds linear --pairs 5 --steps 8`` took 460 s (both
strategies), ``--sizes 3M --pairs 5 --steps 20`` 379 s (both kinds): pick sizes, kinds,
strategies, pairs and steps so that one command fits its window.

Environment variables read: none (each run gets this environment with ``OMP_NUM_THREADS=1``;
a ``MALLOC_*`` variable set here reaches the workers of both sides).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
WORKER = HERE / "sizes" / "worker.py"
sys.path.insert(0, str(HERE / "sizes"))

from models import KINDS, SIZES  # noqa: E402

STRATEGIES = ("ddp", "fsdp")
DEFAULT_STEPS = {"3M": 30, "50M": 12, "200M": 6}
RUN_TIMEOUT_S = 600
GIB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=",".join(SIZES), help="comma list of 3M, 50M, 200M")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma list of linear, transformer")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma list of ddp, fsdp")
    p.add_argument("--pairs", type=int, default=5, help="pairs of runs per case (5)")
    p.add_argument(
        "--steps",
        default=",".join(f"{k}={v}" for k, v in DEFAULT_STEPS.items()),
        help="timed steps per run by size, e.g. 3M=30,50M=12,200M=6, or one number for all",
    )
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    p.add_argument("--threads", action="store_true", help="print CPU time per thread per step")
    p.add_argument("--json", help="also write every run's reports to this file")
    p.add_argument(
        "--hand-allocator",
        choices=("system", "tbb"),
        default="system",
        help="the hand-written side's allocator: system (glibc's, as plain torchrun runs it; "
        "the default) or tbb (oneTBB's, preloaded as multigpu run preloads it into its "
        "workers: what multigpu adds beyond the allocator)",
    )
    args = p.parse_args(argv)
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.kinds = [k for k in args.kinds.split(",") if k]
    args.strategies = [s for s in args.strategies.split(",") if s]
    for given, allowed, flag in (
        (args.sizes, SIZES, "--sizes"),
        (args.kinds, KINDS, "--kinds"),
        (args.strategies, STRATEGIES, "--strategies"),
    ):
        if not given or not set(given) <= set(allowed):
            p.error(f"{flag} {','.join(given)!r}: expected a comma list of {', '.join(allowed)}")
    if args.pairs < 1:
        p.error(f"--pairs {args.pairs}: expected 1 or more")
    steps = dict(DEFAULT_STEPS)
    try:
        if args.steps.isdigit():
            steps = dict.fromkeys(SIZES, int(args.steps))
        else:
            steps.update({k: int(v) for k, v in (i.split("=") for i in args.steps.split(","))})
    except ValueError:
        p.error(f"--steps {args.steps!r}: expected e.g. 3M=30,50M=12,200M=6 or 10")
    if min(steps.values()) < 1 or not set(steps) <= set(SIZES):
        p.error(f"--steps {args.steps!r}: expected sizes of {', '.join(SIZES)}, each >= 1 step")
    args.steps = steps
    return args


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(variant: str, kind: str, size: str, steps: int, warmup: int, out: Path) -> list[str]:
    """The launch command of one run."""
    worker = [
        str(WORKER),
        f"--variant={variant}",
        f"--kind={kind}",
        f"--size={size}",
        f"--steps={steps}",
        f"--warmup={warmup}",
        f"--out-dir={out}",
    ]
    if variant.endswith("-torch"):
        return [str(BIN / "torchrun"), "--nproc-per-node", "2", f"--master-port={free_port()}",
                *worker]  # fmt: skip
    return [str(BIN / "multigpu"), "run", "--cpu", "2", *worker]


def hand_tbb_env(env: dict[str, str]) -> dict[str, str]:
    """``LD_PRELOAD`` of oneTBB's allocator, as ``multigpu run`` sets it for its CPU workers."""
    from multigpu.launch.cpu_allocator import choose_allocator, tbb_libraries

    chosen = choose_allocator({**env, "MULTIGPU_CPU_ALLOCATOR": "tbb"}, device="cpu",
                              libraries=tbb_libraries())  # fmt: skip
    return dict(chosen.env)


def run_once(variant: str, kind: str, size: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One run (a fresh pair of processes); both ranks' reports."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if variant.endswith("-torch") and args.hand_allocator == "tbb":
        env.update(hand_tbb_env(env))
    with tempfile.TemporaryDirectory(prefix="mg-sizes-") as tmp:
        cmd = command(variant, kind, size, args.steps[size], args.warmup, Path(tmp))
        log = Path(tmp) / "log.txt"
        with open(log, "w") as sink:
            # Its own session: a run past the timeout is stopped with its workers.
            child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            try:
                code = child.wait(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                code = -9
        reports = [Path(tmp, f"rank{r}.json") for r in range(2)]
        if code != 0 or not all(r.exists() for r in reports):
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{' '.join(cmd)} exited {code}; last output:\n{tail}")
        return [json.loads(r.read_text()) for r in reports]


def summary(runs: dict[str, list[list[dict[str, Any]]]], hand: str, mine: str) -> dict[str, Any]:
    """Medians, the pairs' ratios and peak memory of one case (rank 0's step times)."""
    theirs = [ranks[0]["step_s"] for ranks in runs[hand]]
    ours = [ranks[0]["step_s"] for ranks in runs[mine]]
    ratios = [m / h for m, h in zip(ours, theirs, strict=True)]
    return {
        "hand_s": statistics.median(theirs),
        "multigpu_s": statistics.median(ours),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "hand_peak": max(max(r["peak_rss"] for r in ranks) for ranks in runs[hand]),
        "multigpu_peak": max(max(r["peak_rss"] for r in ranks) for ranks in runs[mine]),
        "params": runs[mine][0][0]["params"],
    }


def threads_table(runs: dict[str, list[list[dict[str, Any]]]]) -> str:
    """CPU ms per step of each thread name (tids merged, median over runs, rank 0); the
    process's system time within them, and its minor page faults per step."""
    lines = []
    for variant, all_ranks in runs.items():
        per_name: dict[str, list[float]] = {}
        faults: list[float] = []
        steps = len(all_ranks[0][0]["steps_s"])
        for ranks in all_ranks:
            merged: dict[str, float] = {}
            for key, cpu in ranks[0]["threads"].items():
                name = key.rsplit("/", 1)[0]
                merged[name] = merged.get(name, 0.0) + cpu
            faults.append(merged.pop("minor-faults", 0.0) / steps)
            for name, cpu in merged.items():
                per_name.setdefault(name, []).append(cpu / steps * 1e3)
            per_name.setdefault("(system)", []).append(ranks[0]["system_per_step_s"] * 1e3)
        gcs = [ranks[0]["gc"] for ranks in all_ranks]
        gc_line = f"{statistics.median(faults):.0f} page faults/step, "
        cells = ", ".join(
            f"{name} {statistics.median(v):.1f}"
            for name, v in sorted(per_name.items(), key=lambda kv: -statistics.median(kv[1]))
        )
        gc_line += f"gc {statistics.median(g['count'] for g in gcs) / steps:.2f}/step " + (
            f"{statistics.median(g['seconds'] for g in gcs) / steps * 1e3:.2f} ms/step"
        )
        used = all_ranks[0][0].get("allocator", "?")
        lines.append(f"    {variant:<10} ({used}) CPU ms/step by thread: {cells}; {gc_line}")
    return "\n".join(lines)


def machine() -> str:
    """Facts of this machine and its software, for the header."""
    from importlib.metadata import version

    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if ln.startswith("model name")), platform.processor()
    )  # fmt: skip
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} CPUs ({cpu}), {mem:.1f} GiB; "
        f"Linux {platform.release()}; Python {platform.python_version()}, torch "
        f"{version('torch')}; load average {load}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the chosen cases, print a table; 0 (the ratios are reported, not enforced)."""
    args = parse_args(argv)
    print("command: " + " ".join(["python", "benchmarks/sizes.py", *(argv or sys.argv[1:])]))
    print("machine: " + machine())
    malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    chosen = os.environ.get("MULTIGPU_CPU_ALLOCATOR", "auto (tbb where installed)")
    hand = "oneTBB's (LD_PRELOAD, as multigpu's)" if args.hand_allocator == "tbb" else "glibc's"
    print(
        f"environment: OMP_NUM_THREADS=1 in every run; MALLOC_* here: {malloc or 'none'}; "
        f"multigpu's workers' allocator: MULTIGPU_CPU_ALLOCATOR={chosen}; the hand-written "
        f"side's: {hand} (--hand-allocator {args.hand_allocator})"
    )
    header = (
        f"{'case':<22}{'params':>8}{'hand ms':>10}{'multigpu ms':>13}{'ratio':>8}"
        f"{'(min-max)':>15}{'hand GiB':>10}{'multigpu GiB':>14}"
    )
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    for size in args.sizes:
        for kind in args.kinds:
            runs: dict[str, list[list[dict[str, Any]]]] = {}
            for pair in range(args.pairs):
                for strategy in args.strategies:
                    sides = [f"{strategy}-torch", strategy]
                    for variant in sides if pair % 2 == 0 else sides[::-1]:
                        ranks = run_once(variant, kind, size, args)
                        runs.setdefault(variant, []).append(ranks)
                        print(
                            f"  [{time.monotonic() - started:6.0f} s] {size} {kind} pair "
                            f"{pair + 1} {variant:<10} {ranks[0]['step_s'] * 1e3:8.1f} ms/step, "
                            f"peak {max(r['peak_rss'] for r in ranks) / GIB:.2f} GiB, "
                            f"{ranks[0].get('allocator', '?')}",
                            file=sys.stderr,
                            flush=True,
                        )
            if not results:
                print(header)
            for strategy in args.strategies:
                s = summary(runs, f"{strategy}-torch", strategy)
                s.update(size=size, kind=kind, strategy=strategy)
                results.append(s)
                spread = f"({s['ratio_min']:.3f}-{s['ratio_max']:.3f})"
                print(
                    f"{size + ' ' + kind + ' ' + strategy:<22}{s['params'] / 1e6:>7.1f}M"
                    f"{s['hand_s'] * 1e3:>10.1f}{s['multigpu_s'] * 1e3:>13.1f}{s['ratio']:>8.3f}"
                    f"{spread:>15}"
                    f"{s['hand_peak'] / GIB:>10.2f}{s['multigpu_peak'] / GIB:>14.2f}",
                    flush=True,
                )
            if args.threads:
                print(threads_table(runs), flush=True)
            if args.json:
                results[-1]["runs"] = runs  # every run of the case, with its last strategy
    print(f"{args.pairs} pairs per case; {time.monotonic() - started:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
