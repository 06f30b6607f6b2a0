"""Worker functions for ``test_teardown_threads`` (module level: the processes import them)."""

from __future__ import annotations

import os
import threading
from typing import Any

import torch
import torch.nn.functional as F

import multigpu

GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")


def native_threads() -> list[str]:
    """The names of this process's threads that gloo started (its loops and workers)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as fh:
                names.append(fh.read().strip())
        except FileNotFoundError:  # the thread ended after listdir (seen with CUDA's threads)
            continue
    return sorted(n for n in names if n.startswith(GLOO_THREADS))


def finished_job(directory: str, strategy: str) -> dict[str, Any]:
    """A job's life as a script has it: a wrapped model, a background checkpoint, the ``with``
    block's end.

    The model, optimizer and checkpointer stay referenced, as a script's globals do until the
    interpreter finalizes.
    """
    with multigpu.init(seed=0, strategy=strategy) as ctx:
        net = torch.nn.Linear(4, 2)
        model, optimizer = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        ckpt = ctx.checkpointer(directory, async_save=True, model=model, optimizer=optimizer)
        ctx.backward(F.mse_loss(model(torch.randn(8, 4)), torch.zeros(8, 2)))
        ctx.step(optimizer)
        ckpt.step()
        ckpt.save()
        during = native_threads()
    return {
        "during": during,
        "after": native_threads(),
        "python_threads": sorted(t.name for t in threading.enumerate()),
        "held": (model, optimizer, ckpt) is not None,
    }
