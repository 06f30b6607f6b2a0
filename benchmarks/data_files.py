"""RecordFiles (issue 38): bytes read per rank at 1, 2 and 4 processes, and loader throughput
against a hand-written DataLoader over the same files with the same workers.

    python benchmarks/data_files.py [--files 16] [--per-file 4000] [--workers 2] [--repeats 5]

Generated JSON-lines shards (a text field of ~200 bytes per record) in a temporary directory.

Bytes: each rank of ``multigpu``'s gloo CPU processes builds the index (its 1/N of the files,
exchanged) and reads one shuffled epoch (``num_workers=0``: the counter is the process's own);
printed as ratios to 1/N — of the files' bytes for the index, of the records' bytes for the
epoch (1.00 = exactly its share).

Throughput: one process, ``make_loader(RecordFiles(...), num_workers=W)`` against
``DataLoader(HandDataset, batch_size, shuffle=True, num_workers=W)`` where ``HandDataset`` reads
the same records the same way (``os.pread`` of a line at a known offset, ``json.loads``); the two
alternate (which goes first too), ``--repeats`` epochs each, and the ratio is of the median
records/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from multigpu.data import RecordFiles, make_loader
from multigpu.testing import run_distributed

BATCH = 64


def write(directory: Path, files: int, per_file: int) -> int:
    g = torch.Generator().manual_seed(0)
    for f in range(files):
        with open(directory / f"part-{f:04d}.jsonl", "w") as out:
            for k in range(per_file):
                n = int(torch.randint(100, 300, (1,), generator=g))
                text = "".join(chr(97 + int(c)) for c in torch.randint(0, 26, (n,), generator=g))
                out.write(json.dumps({"id": f * per_file + k, "text": text}) + "\n")
    return sum(p.stat().st_size for p in directory.iterdir())


def bytes_worker(directory: str) -> dict[str, int]:
    import multigpu

    with multigpu.init(seed=0) as ctx:
        ds = RecordFiles(directory)
        len(ds)
        index = ds.bytes_read
        loader = ctx.loader(ds, batch_size=BATCH, drop_last=False, move_to_device=False)
        for _ in loader:
            pass
        records = sum(int(s.spans[:, 1].sum()) for s in ds._index())
        return {"index": index, "epoch": ds.bytes_read - index, "records": records}


class HandDataset(Dataset[Any]):
    """What a user would write: each line's offset found once, then pread + json.loads."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.spans: list[tuple[int, int, int]] = []
        for s, path in enumerate(paths):
            offset = 0
            with open(path, "rb") as f:
                for line in f:
                    self.spans.append((s, offset, len(line) - 1))
                    offset += len(line)
        self.fds: dict[int, int] = {}
        self.pid = -1

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int) -> Any:
        if self.pid != os.getpid():
            self.pid, self.fds = os.getpid(), {}
        s, offset, length = self.spans[i]
        fd = self.fds.get(s)
        if fd is None:
            fd = self.fds[s] = os.open(self.paths[s], os.O_RDONLY)
        return json.loads(os.pread(fd, length, offset))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--per-file", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        total = write(directory, args.files, args.per_file)
        print(f"{args.files} JSON-lines files, {args.files * args.per_file} records, {total} bytes")
        print("processes  rank  index bytes / (files/N)  epoch bytes / (records/N)")
        for world in (1, 2, 4):
            ranks = run_distributed(bytes_worker, world, args=(str(directory),), timeout=600)
            for rank, r in enumerate(ranks):
                print(
                    f"{world:9d}  {rank:4d}  {r['index'] / (total / world):23.3f}  "
                    f"{r['epoch'] / (r['records'] / world):25.3f}"
                )

        ours_ds = RecordFiles(directory)
        hand_ds = HandDataset(ours_ds.paths)
        assert len(ours_ds) == len(hand_ds)
        ours = make_loader(
            ours_ds, batch_size=BATCH, rank=0, world_size=1, num_workers=args.workers
        )
        hand = DataLoader(
            hand_ds, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=args.workers
        )
        report(compare(ours, hand, args.repeats, count=lambda b: len(b["id"])), args, BATCH)


def compare(ours: Any, hand: Any, repeats: int, count: Any) -> dict[str, list[float]]:
    """Records/s of ``repeats`` epochs of each loader, alternating (and which goes first);
    ``count(batch)`` is a batch's records."""

    def rate(loader: Any) -> float:
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += count(batch)
        return n / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"multigpu": [], "hand": []}
    for repeat in range(repeats):
        for name in ("multigpu", "hand") if repeat % 2 == 0 else ("hand", "multigpu"):
            rates[name].append(rate(ours if name == "multigpu" else hand))
    return rates


def report(rates: dict[str, list[float]], args: Any, batch: int) -> None:
    """Print the medians' ratio and every epoch's rate."""
    a, b = statistics.median(rates["multigpu"]), statistics.median(rates["hand"])
    print(
        f"throughput, num_workers={args.workers}, batch {batch}, median of {args.repeats} "
        f"epochs: multigpu {a:,.0f} records/s, hand-written DataLoader {b:,.0f} records/s, "
        f"ratio {a / b:.3f}"
    )
    print(
        "  each epoch, multigpu: "
        + ", ".join(f"{x:,.0f}" for x in rates["multigpu"])
        + "; hand: "
        + ", ".join(f"{x:,.0f}" for x in rates["hand"])
    )


if __name__ == "__main__":
    main()
