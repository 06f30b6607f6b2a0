"""Peak memory of a resume against the training run that wrote the checkpoint (issue 36, point 8).

For each configuration, two runs of ``multigpu run --cpu 2`` on the same checkpoint directory:

1. **train**: build the model, ``ctx.setup`` it with AdamW, train ``--steps`` steps, then
   ``ckpt.save()``;
2. **resume**: a fresh pair of processes builds the same model, ``ckpt.resume()``, and trains
   ``--resume-steps`` steps (as many as the training by default: the extra copy issue 36 found
   appeared at the resumed run's *second* step, when DDP rebuilds its buckets).

Each rank reports its peak RSS (``VmHWM``, the whole process) and its growth over the RSS before
the model was built; the ratios resume / train are per rank, the target is at most 1.05. The
model: ``nn.Sequential`` of Linear+ReLU blocks, ``67M`` (16 blocks of 2048 features, 67.1M
parameters) under DDP and ``200M`` (12 blocks of 4096, 201.4M) under FSDP, a batch of 8 rows per
rank, gloo, one thread per process, on the allocator ``multigpu run`` ships (oneTBB's where the
tbb package is installed). ``--torch-init`` adds a run of the first configuration whose resume
makes the optimizer state with torch's own zero step (``get_optimizer_state_dict``'s, as
multigpu did before): the figure the fix is measured against.

Run:  python benchmarks/resume_memory.py [--configs ddp:67M,fsdp:200M] [--steps 3]
                                         [--resume-steps 3] [--torch-init] [--markdown out.md]

Environment variables read: none (``multigpu run`` sets the workers').
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = {"8M": (1024, 8), "67M": (2048, 16), "200M": (4096, 12)}
"""(features, blocks); 8M: a quick check of the benchmark itself."""
STRATEGIES = ("ddp", "fsdp")
TARGET = 1.05
MIB = 2**20


# ---- the worker: one rank of one run (started by `multigpu run`) ---------------------------------
def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def worker(args: argparse.Namespace) -> None:
    import torch
    from torch import nn

    import multigpu

    torch.set_num_threads(1)
    if args.torch_init:  # as multigpu made the state before: torch's zero step, hooks and all
        from torch.distributed.checkpoint.state_dict import _init_optim_state

        from multigpu.strategies import state

        state.initialise_optimizer_state = _init_optim_state
    marks: dict[str, float] = {}
    with multigpu.init(strategy=args.strategy, seed=0, timeout=600) as ctx:
        ctx.barrier()
        base = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # VmHWM back to the current RSS: the peak from here on
        torch.manual_seed(0)
        width = args.width
        net = nn.Sequential(
            *(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(args.blocks))
        )
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
        model, optimizer = ctx.setup(net, optimizer)
        marks["setup"] = _status("VmHWM")
        ckpt = ctx.checkpointer(args.dir, model=model, optimizer=optimizer)
        steps = args.steps
        if args.mode == "resume":
            started = time.perf_counter()
            resumed = ckpt.resume()
            marks["resume_s"] = round(time.perf_counter() - started, 2)
            marks["resume"] = _status("VmHWM")
            if resumed is None:
                raise SystemExit(f"no checkpoint in {args.dir} to resume from")
            steps = args.resume_steps
        for step in range(steps):
            gen = torch.Generator().manual_seed(1000 * step + ctx.rank)
            loss = model(torch.randn(8, width, generator=gen)).square().mean()
            ctx.backward(loss)
            ctx.step(optimizer)
            ckpt.step()
            marks[f"step{step}"] = _status("VmHWM")
        if args.mode == "train":
            ckpt.save()
            marks["save"] = _status("VmHWM")
        report = {"rank": ctx.rank, "base": base, "peak": _status("VmHWM"), "marks": marks}
        Path(args.out, f"{args.mode}-rank{ctx.rank}.json").write_text(json.dumps(report))


# ---- the driver ----------------------------------------------------------------------------------
def launch(config: dict[str, Any], mode: str, directory: Path, out: Path, args: Any) -> None:
    width, blocks = SIZES[config["size"]]
    cmd = [
        sys.executable, "-m", "multigpu", "run", "--cpu", "2", __file__, "--worker",
        f"--mode={mode}", f"--strategy={config['strategy']}", f"--width={width}",
        f"--blocks={blocks}", f"--steps={args.steps}", f"--resume-steps={args.resume_steps}",
        f"--dir={directory}", f"--out={out}",
    ]  # fmt: skip
    if config["torch_init"]:
        cmd.append("--torch-init")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise SystemExit(f"{mode} run of {config['label']} failed:\n" + "\n".join(tail))


def measure(config: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both runs of one configuration; per rank: the training's and the resume's reports."""
    with tempfile.TemporaryDirectory(prefix="mg-resume-memory-") as tmp:
        root = Path(tmp)
        directory, out = root / "ckpt", root / "out"
        out.mkdir()
        started = time.monotonic()
        launch(config, "train", directory, out, args)
        launch(config, "resume", directory, out, args)
        wall = time.monotonic() - started
        ranks = []
        for rank in range(2):
            train = json.loads((out / f"train-rank{rank}.json").read_text())
            resume = json.loads((out / f"resume-rank{rank}.json").read_text())
            ranks.append({"rank": rank, "train": train, "resume": resume, "wall_s": wall})
        shutil.rmtree(directory, ignore_errors=True)
    return ranks


def row(config: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
    train, resume = r["train"], r["resume"]
    grown = (train["peak"] - train["base"], resume["peak"] - resume["base"])
    return {
        "config": config["label"],
        "rank": r["rank"],
        "train_peak_mib": train["peak"] / MIB,
        "resume_peak_mib": resume["peak"] / MIB,
        "ratio": resume["peak"] / train["peak"],
        "train_growth_mib": grown[0] / MIB,
        "resume_growth_mib": grown[1] / MIB,
        "growth_ratio": grown[1] / grown[0],
        "after_resume_mib": (resume["marks"]["resume"] - resume["base"]) / MIB,
        "resume_s": resume["marks"].get("resume_s"),
    }


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"Train {args.steps} steps + `ckpt.save()`, then a fresh run: `ckpt.resume()` + "
        f"{args.resume_steps} steps; 2 CPU processes, AdamW, peak RSS per rank (`VmHWM`).",
        "",
        "| configuration | rank | train peak | resume peak | resume / train | train growth | "
        "resume growth | growth ratio | growth peak in `resume()` | resume time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['rank']} | {r['train_peak_mib']:.0f} MiB | "
            f"{r['resume_peak_mib']:.0f} MiB | **{r['ratio']:.3f}x** | "
            f"{r['train_growth_mib']:.0f} MiB | {r['resume_growth_mib']:.0f} MiB | "
            f"{r['growth_ratio']:.3f}x | {r['after_resume_mib']:.0f} MiB | {r['resume_s']} s |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="ddp:67M,fsdp:200M", help="strategy:size, comma list")
    p.add_argument("--steps", type=int, default=3, help="training steps before the save (3)")
    p.add_argument("--resume-steps", type=int, default=3, help="steps after the resume (3)")
    p.add_argument("--torch-init", action="store_true", help="also: resume as before the fix")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run (1800)")
    p.add_argument("--markdown", help="write the table here (for benchmarks/RESULTS.md)")
    p.add_argument("--json", help="write every rank's reports here")
    # The worker's own options (set by the driver).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("train", "resume"), help=argparse.SUPPRESS)
    p.add_argument("--strategy", help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, help=argparse.SUPPRESS)
    p.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    configs = []
    for item in (c for c in args.configs.split(",") if c):
        strategy, _, size = item.partition(":")
        if strategy not in STRATEGIES or size not in SIZES:
            raise SystemExit(
                f"--configs {item!r}: expected strategy:size with a strategy of "
                f"{', '.join(STRATEGIES)} and a size of {', '.join(SIZES)}, e.g. ddp:67M"
            )
        configs.append({"label": f"{strategy} {size}", "strategy": strategy, "size": size,
                        "torch_init": False})  # fmt: skip
    if args.torch_init and configs:
        first = configs[0]
        configs.append({**first, "label": f"{first['label']}, torch's zero step (before)",
                        "torch_init": True})  # fmt: skip
    print(f"resume memory: {', '.join(c['label'] for c in configs)}; target <= {TARGET}x")
    rows, log = [], []
    for config in configs:
        ranks = measure(config, args)
        log.append({"config": config, "ranks": ranks})
        for r in ranks:
            rows.append(row(config, r))
            last = rows[-1]
            print(
                f"  {last['config']:<40} rank {last['rank']}: train {last['train_peak_mib']:6.0f}"
                f" MiB, resume {last['resume_peak_mib']:6.0f} MiB: {last['ratio']:.3f}x "
                f"(growth {last['growth_ratio']:.3f}x)  {r['wall_s']:.0f} s",
                flush=True,
            )
    text = markdown(rows, args)
    print()
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(log, indent=1))
    shipped = [r for r in rows if "before" not in r["config"]]
    worst = max((r["ratio"] for r in shipped), default=0.0)
    print(f"worst resume / train: {worst:.3f}x ({'within' if worst <= TARGET else 'OVER'} "
          f"the {TARGET}x target)")  # fmt: skip
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
