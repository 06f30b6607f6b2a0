"""Worker of the full-disk tests: saves that cannot fit on a small tmpfs (run_distributed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

BIG = 3_000_000  # bytes: more than the whole 2 MiB file system


class Extra(torch.nn.Linear):
    """A model whose extra state (a DCP value, not a tensor: not in the size estimate) can be
    made bigger than the disk, so that the disk fills while DCP writes."""

    big = False

    def get_extra_state(self) -> bytes:
        return b"x" * (BIG if self.big else 8)

    def set_extra_state(self, state: Any) -> None:
        pass


class Counts:
    """A per-rank object whose state can be made bigger than the disk (its rank file)."""

    big = False

    def state_dict(self) -> dict[str, bytes]:
        return {"counts": b"c" * (BIG if self.big else 8)}

    def load_state_dict(self, state: dict[str, bytes]) -> None:
        pass


def _listing(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not n.startswith(".multigpu"))


def fill_the_disk(directory: str, filler: str) -> dict[str, Any]:
    """Save step 3, then saves that do not fit: while DCP writes (sync, async), while the rank
    files are written, and one refused before writing; then resume. Returns each error's text,
    the directory after each, and what resume found."""
    import multigpu

    out: dict[str, Any] = {}
    with multigpu.init(seed=0) as ctx:
        raw = Extra(100, 100)
        model = ctx.setup(raw)
        saved = {k: v.clone() for k, v in raw.state_dict().items() if torch.is_tensor(v)}

        def attempt(name: str, ckpt: Any, step: int) -> None:
            ckpt._steps = step
            try:
                ckpt.save()
                ckpt.wait()
                out[name] = "saved"
            except multigpu.CheckpointError as e:
                out[name] = f"{type(e).__name__}: {e}"
            ctx.barrier()
            out[name + " left"] = _listing(directory)

        ckpt = ctx.checkpointer(directory, model=model)
        attempt("first", ckpt, 3)
        raw.big = True
        attempt("dcp", ckpt, 6)
        background = ctx.checkpointer(directory, model=model, async_save=True)
        attempt("async", background, 9)
        background.close()
        raw.big = False
        counts = Counts()
        counts.big = True
        per_rank = ctx.checkpointer(directory, model=model).track_per_rank(counts=counts)
        attempt("rank file", per_rank, 12)
        if ctx.rank == 0:
            free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
            Path(filler).write_bytes(b"f" * (free - 64 * 1024))
        ctx.barrier()
        attempt("refused", ckpt, 15)
        ctx.barrier()
        if ctx.rank == 0:
            os.unlink(filler)
        with torch.no_grad():
            for p in raw.parameters():
                p.zero_()
        out["resumed"] = ctx.checkpointer(directory, model=model).resume()
        out["restored"] = all(torch.equal(raw.state_dict()[k], v) for k, v in saved.items())
    return out
