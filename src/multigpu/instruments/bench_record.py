"""The worker side of ``multigpu bench scaling``: when each optimizer step of a script ends.

A Context hook of its own (``multigpu.instruments.hooks``), attached by ``init()`` when
``MULTIGPU_BENCH_DIR`` is set (``multigpu.session.initialize``): ``multigpu verify``'s recorder, but
keeping, instead of losses and parameters, the time at which each optimizer step ends and the
samples one step consumes (the global batch of the first shuffling ``ctx.loader``). After
``MULTIGPU_BENCH_STEPS`` steps it writes its record and stops the script cleanly (``VerifyStop``, a
``SystemExit(0)``); a script that ends sooner is recorded at teardown. On CUDA each step's time is
taken after ``torch.cuda.synchronize()``, so it is the GPU's time, not the launch queue's.

File ``bench-rank{r}.json`` in ``MULTIGPU_BENCH_DIR``: ``{"rank", "world_size", "steps",
"step_ends" (seconds since init at the end of each step), "samples_per_step" (null without
``ctx.loader``), "threads" (torch's intra-op threads), "device"}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.instruments.verify_record import VerifyRecorder


class BenchRecorder(VerifyRecorder):
    """Times the optimizer steps for ``multigpu bench scaling`` (see the module doc)."""

    FILE = "bench-rank{rank}.json"
    """One rank's record (the reader, ``multigpu.diagnostics.bench.scaling``, repeats the name)."""

    def __init__(self, directory: Path, steps: int, rank: int, world_size: int) -> None:
        super().__init__(directory, steps, rank, world_size)
        self._started = time.perf_counter()
        self.step_ends: list[float] = []
        self._cuda = False

    def on_setup(
        self, ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        self._cuda = self._cuda or any(p.is_cuda for p in model.parameters())
        for optimizer in optimizers:
            optimizer.register_step_post_hook(lambda *_: self._on_step())

    def wrap_backward(self, ctx: Any, backward: Callable[..., None]) -> Callable[..., None]:
        return backward  # reading the loss would synchronise a GPU at every micro-step

    def _note_step(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        self.step_ends.append(time.perf_counter() - self._started)

    def record(self) -> dict[str, Any]:
        """This rank's record (see the module doc)."""
        training = [info for info in self.loaders if info.get("shuffle")] or self.loaders
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "steps": self.steps,
            "step_ends": self.step_ends,
            "samples_per_step": training[0]["global_batch_size"] if training else None,
            "threads": torch.get_num_threads(),
            "device": "cuda" if self._cuda else "cpu",
        }

    def _write_models(self) -> None:
        """No parameters: bench compares no results."""
