"""``torch.profiler`` over a window of optimizer steps, per rank, as Chrome-trace JSON.

Environment variables set: ``KINETO_LOG_LEVEL`` (to 6, unless given: quiet). A Context hook
(``multigpu.instruments.hooks``) attached by ``init(profile="3:5")`` or ``MULTIGPU_PROFILE``
(``multigpu.session.initialize``): it starts the profiler when step FIRST - 1 ends (at ``ctx.setup``
for step 1) and stops it when step LAST ends, then writes ``DIRECTORY/rank{r}.json`` — CPU activity,
and CUDA's on a GPU — which Perfetto (https://ui.perfetto.dev) and ``chrome://tracing`` open.
Rank 0 says in one line where the traces went. A run that ends inside the window writes what
it recorded (and says so, but not after Ctrl-C, whose ending is the two lines that say it). Steps
count this process's optimizer steps from 1 (a resumed run's too): ``ctx.step``'s, or those of
the optimizer the script steps itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.common import worker_exit
from multigpu.instruments.hooks import Hook

log = logging.getLogger(__name__)


class ProfileHook(Hook):
    """Traces optimizer steps ``window[0]`` to ``window[1]`` into ``directory`` (module doc)."""

    def __init__(
        self, window: tuple[int, int], directory: Path, rank: int, world_size: int
    ) -> None:
        self.window, self.directory = window, Path(directory)
        self.rank, self.world_size = rank, world_size
        self.steps = 0
        self._profiler: Any = None
        self._done = False

    def on_setup(
        self, ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        if self.window[0] == 1 and not self.steps:
            self._start(ctx)

    def on_step(self, ctx: Any) -> None:
        self.steps += 1
        if self.steps == self.window[0] - 1:
            self._start(ctx)
        elif self.steps == self.window[1]:
            self._finish(ctx, complete=True)

    def on_exit(self, ctx: Any, error: BaseException | None) -> None:
        stopped = isinstance(error, KeyboardInterrupt) or worker_exit.interrupted()
        self._finish(ctx, complete=False, quiet=stopped)

    def on_teardown(self, ctx: Any) -> None:
        self._finish(ctx, complete=False)

    def _start(self, ctx: Any) -> None:
        if self._profiler is not None or self._done:
            return
        # Kineto prints two "USDT: ... profiler_start/stop" lines per rank at its default level;
        # it reads its level only from the environment, when the profiler first starts.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if ctx.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.__enter__()

    def _finish(self, ctx: Any, *, complete: bool, quiet: bool = False) -> None:
        if self._profiler is None:
            return
        profiler, self._profiler, self._done = self._profiler, None, True
        profiler.__exit__(None, None, None)
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / f"rank{self.rank}.json"
        partial = target.with_name(f".{target.name}.partial")
        profiler.export_chrome_trace(str(partial))
        os.replace(partial, target)  # a trace is whole or absent
        if self.rank == 0 and not quiet:
            first, last = self.window
            upto = last if complete else self.steps
            ranks = "" if self.world_size == 1 else f", r = 0..{self.world_size - 1}"
            print(
                f"profile: optimizer steps {first}-{upto} traced to {self.directory}/rank<r>.json"
                f" (Chrome trace{ranks}; open in https://ui.perfetto.dev or chrome://tracing)"
                + ("" if complete else f"; the run ended before step {last}"),
                flush=True,
            )
