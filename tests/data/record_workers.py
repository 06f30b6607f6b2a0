"""Module-level worker functions for the RecordFiles tests (importable by spawned children)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

GLOBAL_BATCH = 8


def write_shards(directory: Path, files: int, per_file: int, seed: int = 0) -> int:
    """Write ``files`` JSON-lines shards of ``per_file`` records (id, x, y); return the bytes."""
    g = torch.Generator().manual_seed(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(directory / f"part-{f:03d}.jsonl", "w") as out:
            for k in range(per_file):
                x = torch.randn(4, generator=g)
                y = float(x @ torch.tensor([1.0, -2.0, 0.5, 3.0]))
                record = {"id": f * per_file + k, "x": [round(float(v), 6) for v in x], "y": y}
                out.write(json.dumps(record) + "\n")
    return sum(p.stat().st_size for p in directory.iterdir())


def as_tensors(record: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, int]:
    return torch.tensor(record["x"]), torch.tensor(record["y"]), record["id"]


def batches(data_dir: str, num_workers_list: list[int]) -> dict[str, Any]:
    """Each rank's record ids per step, two epochs, for each ``num_workers``; and bytes read:
    the index's share and an unshuffled epoch's share, with ``num_workers=0``."""
    import multigpu
    from multigpu.data import RecordFiles

    out: dict[str, Any] = {}
    with multigpu.init(seed=5) as ctx:
        plain = RecordFiles(data_dir, transform=as_tensors)
        len(plain)
        out["index_bytes"] = plain.bytes_read
        loader = ctx.loader(plain, batch_size=GLOBAL_BATCH, shuffle=False, move_to_device=False)
        for _ in loader:
            pass
        out["record_bytes"] = plain.bytes_read - out["index_bytes"]
        for workers in num_workers_list:
            ds = RecordFiles(data_dir, transform=as_tensors)
            shuffled = ctx.loader(ds, batch_size=GLOBAL_BATCH, num_workers=workers)
            out[f"epochs_{workers}"] = [[b[2].tolist() for b in shuffled] for _ in range(2)]
    return out


def train(
    data_dir: str, checkpoint_dir: str | None, steps: int, stop_at: int | None, num_workers: int
) -> dict[str, Any]:
    """Train a linear model on the shards for ``steps`` steps; with ``checkpoint_dir``, resume
    what it holds, and save there and stop after step ``stop_at``."""
    import multigpu
    from multigpu.data import RecordFiles

    with multigpu.init(seed=0) as ctx:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        data = RecordFiles(data_dir, transform=as_tensors)
        loader = ctx.loader(data, batch_size=GLOBAL_BATCH, num_workers=num_workers)
        model, optimizer = ctx.setup(model, optimizer)
        ckpt = None
        step = 0
        if checkpoint_dir is not None:
            ckpt = ctx.checkpointer(checkpoint_dir, model=model, optimizer=optimizer, data=loader)
            step = ckpt.resume() or 0
        seen: list[int] = []
        while step < steps and (stop_at is None or step < stop_at):
            for x, y, ids in loader:
                seen += ids.tolist()
                loss = (model(x).squeeze(1) - y).square().mean()
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
        return {"params": params, "seen": seen, "step": step, "rank": int(os.environ["RANK"])}


def resume_over_a_changed_file(data_dir: str, checkpoint_dir: str) -> str:
    """Train 3 steps with a checkpoint, change one record of a file, resume: the refusal (the
    Context ends a block that a usage error leaves with its line and exit code 2)."""
    from multigpu.errors import DataError

    train(data_dir, checkpoint_dir, 8, 3, 0)
    changed = Path(data_dir) / "part-002.jsonl"
    changed.write_text(changed.read_text().replace('"id": 2', '"id": 7', 1))  # same size
    try:
        train(data_dir, checkpoint_dir, 8, None, 0)
    except SystemExit as e:
        cause = e.__cause__
        return str(cause) if isinstance(cause, DataError) else f"another error: {cause!r}"
    return "resumed"
