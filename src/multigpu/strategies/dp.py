"""``dp``: torch.nn.DataParallel — one process driving every visible GPU (legacy).

DataParallel replicates the model onto each GPU on every forward, scatters the batch and gathers
outputs on GPU 0, which therefore holds more memory than the others and often limits the batch
size; it is single-process and GIL-bound. Prefer ``ddp``. It exists for scripts that depend on it.
On the CPU DataParallel does nothing at all (``device_ids=[]``): we say so and run unwrapped.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from multigpu.common.log import warn_once
from multigpu.errors import UsageError
from multigpu.strategies.base import Strategy
from multigpu.strategies.materialize import place

log = logging.getLogger(__name__)


class DataParallelStrategy(Strategy):
    """Wrap the model in ``nn.DataParallel`` over ``device_ids`` (default: all visible GPUs)."""

    name = "dp"
    compiles = False

    def __init__(self, device_ids: list[int] | None = None) -> None:
        super().__init__()
        self.device_ids = device_ids

    def validate(self) -> None:
        if self.world_size > 1:
            # The advice differs by device: on GPUs one process must see every GPU (plain
            # python; `--nproc-per-node 1` would hide all but one), on CPUs the flag is --cpu.
            one = (
                "multigpu run --cpu 1"
                if self.device.type == "cpu"
                else "python script.py, so one process sees every GPU"
            )
            raise UsageError(
                f"strategy='dp' was asked for with world_size={self.world_size}; DataParallel is "
                f"one process over several GPUs; launch one process ({one}) "
                "or use strategy='ddp'"
            )

    def wrap(self, module: nn.Module) -> nn.Module:
        module = place(module, self.device)
        if self.device.type != "cuda":
            warn_once(
                log,
                "strategy='dp' on %s: DataParallel is a pass-through without CUDA GPUs; "
                "the model runs unwrapped on one device",
                self.device,
            )
            return module
        ids = self.device_ids
        if ids is None:
            ids = list(range(torch.cuda.device_count()))
        if len(ids) < 2:
            warn_once(log, "strategy='dp' with %d GPU: nothing to parallelise", len(ids))
        return nn.DataParallel(module, device_ids=ids, output_device=ids[0] if ids else None)

    def describe(self) -> dict[str, object]:
        return {"strategy": self.name, "device_ids": self.device_ids}
