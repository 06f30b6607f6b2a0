"""A stream several times larger than the machine's free memory, through ``ctx.loader``: is the
memory per rank flat? (issue 38, point 6)

    python benchmarks/stream_memory.py [--times 3] [--sample-kib 256] [--batch 64]
        [--buffer 1000] [--workers 0]

A generated ``torch.utils.data.IterableDataset`` (nothing on disk): samples of ``--sample-kib``
KiB (float32, filled with the sample's number), ``--times`` the machine's ``MemAvailable`` in
all, shuffled through ``ctx.loader``'s buffer of ``--buffer`` samples. ``multigpu run --cpu 2``
runs one epoch; each rank reads the stream whole (a stream has no shards) and keeps its part
of each global batch of ``--batch`` samples, checking each sample's contents. Every rank samples
its ``VmRSS`` at each tenth of the epoch and prints the trace; flat means the last tenth's RSS is
within a few percent of the first's, and the peak (``VmHWM``) is far below the stream.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
MIB = 2**20


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def worker(args: argparse.Namespace) -> None:
    """One rank: read the generated stream for one epoch, sampling the RSS."""
    import torch
    from torch.utils.data import IterableDataset

    import multigpu

    numbers = args.sample_kib * 1024 // 4

    class Generated(IterableDataset):  # type: ignore[type-arg]
        def __init__(self, count: int) -> None:
            self.count = count

        def __iter__(self):  # type: ignore[no-untyped-def]
            for i in range(self.count):
                yield torch.full((numbers,), float(i))

    with multigpu.init(seed=0) as ctx:
        stream = Generated(args.samples)
        loader = ctx.loader(stream, batch_size=args.batch, buffer_size=args.buffer,
                            num_workers=args.workers)  # fmt: skip
        steps = args.samples // args.batch
        marks = {max(1, steps * k // 10) for k in range(1, 11)}
        trace, began, seen = [], time.monotonic(), 0
        for step, batch in enumerate(loader, start=1):
            # The contents came through whole: every element of a sample is its number.
            assert bool((batch == batch[:, :1]).all()), "a sample's contents were mixed"
            seen += len(batch)
            if step in marks:
                trace.append(_status("VmRSS"))
        result = {
            "rank": ctx.rank,
            "samples_kept": seen,
            "seconds": time.monotonic() - began,
            "rss_trace": trace,
            "peak": _status("VmHWM"),
        }
        Path(args.out, f"rank{ctx.rank}.json").write_text(json.dumps(result))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--times", type=float, default=3.0, help="the stream, in MemAvailable's (3)")
    p.add_argument("--sample-kib", type=int, default=256, help="KiB per sample (256)")
    p.add_argument("--batch", type=int, default=64, help="global batch (64)")
    p.add_argument("--buffer", type=int, default=1000, help="shuffle buffer, samples (1000)")
    p.add_argument("--workers", type=int, default=0, help="loader workers per rank (0)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    free = _mem_available()
    samples = int(args.times * free // (args.sample_kib * 1024))
    samples -= samples % args.batch
    stream = samples * args.sample_kib * 1024
    print(f"command: python benchmarks/stream_memory.py {' '.join(sys.argv[1:])}")
    print(f"MemAvailable {free / 2**30:.1f} GiB; stream {samples:,} samples of "
          f"{args.sample_kib} KiB = {stream / 2**30:.1f} GiB ({stream / free:.2f}x); "
          f"buffer {args.buffer} samples ({args.buffer * args.sample_kib / 1024:.0f} MiB), "
          f"batch {args.batch}, {args.workers} worker(s)")  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        cmd = ["multigpu", "run", "--cpu", "2", str(HERE), "--worker", f"--samples={samples}",
               f"--sample-kib={args.sample_kib}", f"--batch={args.batch}",
               f"--buffer={args.buffer}", f"--workers={args.workers}", f"--out={out}"]  # fmt: skip
        began = time.monotonic()
        subprocess.run(cmd, check=True, cwd=HERE.parent.parent)
        wall = time.monotonic() - began
        for rank in range(2):
            r = json.loads(Path(out, f"rank{rank}.json").read_text())
            trace = r["rss_trace"]
            print(f"rank {rank}: kept {r['samples_kept']:,} samples in {r['seconds']:.0f} s; "
                  f"RSS at each tenth (MiB): {' '.join(str(t // MIB) for t in trace)}; "
                  f"last/first {trace[-1] / trace[0]:.3f}; peak {r['peak'] / MIB:.0f} MiB "
                  f"= {r['peak'] / stream:.4f} of the stream")  # fmt: skip
    print(f"{wall:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
