"""Module-level worker functions for the stream tests (importable by spawned children)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset

GLOBAL_BATCH = 8
BUFFER = 16
HF_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # local files: no hub look-up


def write_shards(directory: Path, files: int, per_file: int, seed: int = 0) -> list[str]:
    """Write ``files`` JSON-lines shards of ``per_file`` records (id, x, y); return the paths."""
    g = torch.Generator().manual_seed(seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        path = directory / f"part-{f:03d}.jsonl"
        with open(path, "w") as out:
            for k in range(per_file):
                x = torch.randn(4, generator=g)
                y = float(x @ torch.tensor([1.0, -2.0, 0.5, 3.0]))
                record = {"id": f * per_file + k, "x": [round(float(v), 6) for v in x], "y": y}
                out.write(json.dumps(record) + "\n")
        paths.append(str(path))
    return paths


class JsonLines(IterableDataset):  # type: ignore[type-arg]
    """A plain stream: the records of the files in order, as Hugging Face's torch format gives
    them (a dict of tensors: id int64, x and y float32)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = list(paths)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for path in self.paths:
            with open(path) as lines:
                for line in lines:
                    r = json.loads(line)
                    yield {
                        "id": torch.tensor(r["id"]),
                        "x": torch.tensor(r["x"]),
                        "y": torch.tensor(r["y"]),
                    }


def make_stream(source: str, paths: list[str]) -> Any:
    """``plain``: ``JsonLines``; ``hf``: ``load_dataset("json", streaming=True)`` over the same
    files, in torch format."""
    if source == "plain":
        return JsonLines(paths)
    from datasets import load_dataset

    # A cache of its own beside the files, not the user's ~/.cache shared by tests side by side
    # (xdist): one of them failed once with -n 2, not reproduced since; this rules the cache out.
    cache = str(Path(paths[0]).parent / "hf-cache")
    stream = load_dataset("json", data_files=paths, streaming=True, split="train", cache_dir=cache)
    return stream.with_format("torch")


class Lines(logging.Handler):
    """The messages logged to it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def train(paths: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Train a linear model once per entry of ``runs`` (source, workers, steps; with ``ckpt``:
    resume what it holds, and with ``stop_at`` save there and stop after that step); return each
    run's parameters, ids seen and last step, and the stream loader's lines on this rank."""
    import multigpu

    said = Lines()
    logging.getLogger("multigpu.data.stream_loader").addHandler(said)
    out: dict[str, Any] = {"rank": int(os.environ["RANK"]), "runs": []}
    streams: dict[str, Any] = {}
    with multigpu.init(seed=0) as ctx:
        for run in runs:
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            if run["source"] not in streams:  # one stream per source, read again by each run
                streams[run["source"]] = make_stream(run["source"], paths)
            stream = streams[run["source"]]
            loader = ctx.loader(
                stream, batch_size=GLOBAL_BATCH, num_workers=run["workers"], buffer_size=BUFFER
            )
            model, optimizer = ctx.setup(model, optimizer)
            ckpt, stop_at, steps = None, run.get("stop_at"), run["steps"]
            step = 0
            if run.get("ckpt"):
                ckpt = ctx.checkpointer(run["ckpt"], model=model, optimizer=optimizer, data=loader)
                step = ckpt.resume() or 0
            seen: list[int] = []
            while step < steps and (stop_at is None or step < stop_at):
                for batch in loader:
                    seen += batch["id"].tolist()
                    loss = (model(batch["x"]).squeeze(1) - batch["y"]).square().mean()
                    ctx.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    step += 1
                    if ckpt is not None:
                        ckpt.step()
                        if step == stop_at:
                            ckpt.save()
                    if step in (steps, stop_at):
                        break
            params = {k: v.detach().clone() for k, v in ctx.full_state_dict(model).items()}
            if ckpt is not None:
                ckpt.close()
            out["runs"].append(
                {"params": params, "seen": seen, "step": step, "epoch": loader.epoch}
            )
    out["said"] = said.lines
    return out
