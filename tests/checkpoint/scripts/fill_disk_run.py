"""Saves, under argv[1], a checkpoint bigger than its file system (the full-disk test's tmpfs):
its model's extra state (a DCP value) is 3 MB, so the disk fills while DCP writes."""

import sys

import torch

import multigpu


class Extra(torch.nn.Linear):
    def get_extra_state(self) -> bytes:
        return b"x" * 3_000_000

    def set_extra_state(self, state: object) -> None:
        pass


with multigpu.init(seed=0) as ctx:
    model = ctx.setup(Extra(10, 10))
    ctx.checkpointer(sys.argv[1], every_steps=1, model=model).step()
