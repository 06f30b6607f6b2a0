"""A Hugging Face stream read by shard lanes (issue 38, point 3): bytes read per rank at 1, 2 and
4 processes, and loader throughput against the DataLoader a user would hand-write over the same
stream with the same workers.

    python benchmarks/hf_stream_bytes.py [--files 16] [--per-file 4000] [--workers 2] [--repeats 5]

Generated JSON-lines shards (a text field of ~200 bytes per record, as benchmarks/data_files.py
writes them) read by ``load_dataset("json", data_files=..., streaming=True)``.

Bytes: the bytes each rank's process read (``rchar`` of ``/proc/self/io``: every ``read()``,
page cache or not) over two epochs of ``ctx.loader(stream, batch_size=64)`` on gloo CPU
processes with ``num_workers=0`` (so that the counter is the rank's own): epoch 0 counts the
shards' records (each rank 1/N of the files) and reads the rank's lanes; epoch 1 only reads.
Printed as ratios to 1/N of the files' bytes (1.00 = exactly its share).

Throughput: one process, ``make_loader(stream, num_workers=W)`` (by lanes: the workers split the
lanes, the main process collates) against ``DataLoader(stream, batch_size, num_workers=W)``
(the HF stream's own split of its shards among the workers, no shuffle); after an epoch of each
(ours counts the shards' records in it, once) they alternate (and which goes first),
``--repeats`` epochs each, the ratio of the median records/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_files import compare, report, write

from multigpu.data import make_loader
from multigpu.testing import run_distributed

BATCH = 64
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def stream(directory: str) -> Any:
    from datasets import load_dataset

    files = sorted(str(p) for p in Path(directory).glob("*.jsonl"))
    cache = str(Path(directory) / "hf-cache")
    return load_dataset("json", data_files=files, streaming=True, split="train", cache_dir=cache)


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def collate(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples as they are: both loaders move the same objects from their workers."""
    return samples


def bytes_worker(directory: str) -> dict[str, Any]:
    import multigpu

    with multigpu.init(seed=0) as ctx:
        loader = ctx.loader(stream(directory), batch_size=BATCH, collate_fn=collate)
        epochs = []
        for _ in range(2):
            before = rchar()
            for _ in loader:
                pass
            epochs.append(rchar() - before)
        return {"epochs": epochs, "lanes": loader.lanes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--per-file", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.update(OFFLINE)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        total = write(directory, args.files, args.per_file)
        print(f"{args.files} JSON-lines files, {args.files * args.per_file} records, {total} bytes")
        print("processes  rank  lanes  epoch 0 bytes / (files/N)  epoch 1 bytes / (files/N)")
        for world in (1, 2, 4):
            ranks = run_distributed(
                bytes_worker, world, args=(str(directory),), env=OFFLINE, timeout=900
            )
            for rank, r in enumerate(ranks):
                e0, e1 = (b / (total / world) for b in r["epochs"])
                print(f"{world:9d}  {rank:4d}  {r['lanes']:5d}  {e0:25.3f}  {e1:25.3f}")

        ours = make_loader(
            stream(str(directory)), batch_size=BATCH, rank=0, world_size=1,
            num_workers=args.workers, collate_fn=collate,
        )  # fmt: skip
        hand = DataLoader(
            stream(str(directory)), batch_size=BATCH, num_workers=args.workers,
            collate_fn=collate,
        )  # fmt: skip
        compare(ours, hand, 1, count=len)  # warm: ours counts the shards' records once here
        report(compare(ours, hand, args.repeats, count=len), args, BATCH)


if __name__ == "__main__":
    main()
