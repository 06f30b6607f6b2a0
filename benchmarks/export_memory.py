"""Peak memory of exporting a sharded checkpoint to safetensors, against the gather-it-all way.

A checkpoint of an MLP (``Linear(2048, 2048)`` layers, float32, 16 MiB each) is written by
``ctx.save`` at several sizes; each is then exported, in a fresh process per run, by:

- ``multigpu``: ``multigpu ckpt convert CK OUT --to safetensors --max-shard-size 100MB``
  (``export_hub``: one tensor at a time from DCP, one output file at a time);
- ``multigpu-1file``: the same with the default ``--max-shard-size 5GB``: every size here fits
  one file, so the whole model is one output shard — the bound the shard size sets;
- ``baseline``: what one does without it: ``dcp_to_torch_save`` (torch's own, the whole state
  into memory and into one file), ``torch.load`` of that file, ``safetensors.torch.save_file``.

Each run reports the growth of its peak RSS (``VmHWM`` after the export minus ``VmRSS`` before
it, from ``/proc/self/status``), as a ratio of the checkpoint's size and of the baseline's
growth measured in the same round (the variants' order rotates every round).

Run:  python benchmarks/export_memory.py [--sizes 256,512,1024] [--rounds 2] [--dir DIR]

Environment variables read: none.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("multigpu", "multigpu-1file", "baseline")
LAYER_MIB = 16  # one Linear(2048, 2048) in float32, plus its bias (8 KiB)


def _status(field: str) -> int:
    """A ``/proc/self/status`` figure in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(variant: str, checkpoint: str, out: str) -> None:
    """One export in this process; prints {"growth": bytes, "seconds": s} as JSON."""
    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from multigpu.checkpoint.hub_export import export_hub

    before = _status("VmRSS")
    started = time.perf_counter()
    if variant == "baseline":
        whole = Path(out).with_suffix(".pt")
        dcp_to_torch_save(checkpoint, whole)
        state = torch.load(whole, weights_only=True)["model"]
        Path(out).mkdir()
        save_file(state, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
    else:
        shard = "100MB" if variant == "multigpu" else "5GB"
        export_hub(checkpoint, out, max_shard_size=shard)
    seconds = time.perf_counter() - started
    print(json.dumps({"growth": _status("VmHWM") - before, "seconds": seconds}))


def write_checkpoint(directory: Path, mib: int) -> int:
    """A ``ctx.save`` checkpoint of an MLP of about ``mib`` MiB; returns its tensor bytes."""
    import torch

    import multigpu

    layers = max(1, mib // LAYER_MIB)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(layers)])
    with multigpu.init(seed=0, accelerator="cpu", environ={}) as ctx:
        ctx.save(directory, {"model": model})
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def run(variant: str, checkpoint: Path, work: Path) -> dict[str, Any]:
    out = work / f"out-{variant}"
    done = subprocess.run(
        [sys.executable, __file__, "--child", variant, str(checkpoint), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} failed: {done.stderr.strip().splitlines()[-1:]}")
    shutil.rmtree(out, ignore_errors=True)
    out.with_suffix(".pt").unlink(missing_ok=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256,512,1024", help="checkpoint sizes in MiB")
    p.add_argument("--rounds", type=int, default=2, help="runs of each variant per size (2)")
    p.add_argument("--dir", help="where to write (default: a temporary directory)")
    p.add_argument("--child", nargs=3, metavar=("VARIANT", "CKPT", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    print("| checkpoint | export | peak RSS growth | vs checkpoint | vs baseline | time |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        for mib in (int(s) for s in args.sizes.split(",")):
            checkpoint = work / f"ck-{mib}"
            size = write_checkpoint(checkpoint, mib)
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for round_ in range(args.rounds):
                order = VARIANTS[round_ % 3 :] + VARIANTS[: round_ % 3]
                for variant in order:
                    runs[variant].append(run(variant, checkpoint, work))
            base = statistics.median(r["growth"] for r in runs["baseline"])
            for variant in VARIANTS:
                growth = statistics.median(r["growth"] for r in runs[variant])
                seconds = statistics.median(r["seconds"] for r in runs[variant])
                print(
                    f"| {size / 2**20:.0f} MiB | {variant} | {growth / 2**20:.0f} MiB | "
                    f"{growth / size:.2f}x | {growth / base:.2f}x | {seconds:.1f} s |",
                    flush=True,
                )
            shutil.rmtree(checkpoint)


if __name__ == "__main__":
    main()
