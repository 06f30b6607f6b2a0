"""The hang tools as one Context hook (``multigpu.instruments.hooks``), attached by ``init()`` above
one process (``multigpu.session.initialize``)."""

from __future__ import annotations

import itertools
import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from multigpu.common import worker_error
from multigpu.instruments.hang.install import uninstall
from multigpu.instruments.hang.peers import is_collective_failure, report_lost_peers
from multigpu.instruments.hang.stragglers import straggler_lines
from multigpu.instruments.hang.watchdog import PREFIX, Watchdog
from multigpu.instruments.hooks import Hook

log = logging.getLogger(__name__)

# How the hang explainer names a backward pass: the collective it runs inside.
_BACKWARD_OPS = {
    "ddp": "backward (DDP gradient all-reduce)",
    "fsdp": "backward (FSDP all-gather and reduce-scatter)",
}

_REPORTS = itertools.count()
"""This process's straggler reports so far: the n-th of every rank meets under one key."""


class HangHook(Hook):
    """The hang tools of one Context: the watchdog (None: ``MULTIGPU_WATCHDOG=0``), the straggler
    report and, after a collective failed, which ranks still answer
    (``multigpu.instruments.hang.peers``). The collectives are recorded
    (``multigpu.instruments.hang.install``, by ``start_watchdog``) until the Context's teardown,
    which ends the recording.

    The straggler report is a store exchange, not a collective: at the end of the ``with`` block
    every other rank leaves its (busy seconds, steps) in the process group's store — null when
    its block ended by an error — and goes on at once; rank 0 polls for them at most
    ``timeout`` (the context's) and says nothing when one is missing. A peer that never comes can
    neither hold a finished rank longer nor fail it.
    """

    def __init__(self, watchdog: Watchdog | None, timeout: timedelta) -> None:
        self.watchdog, self.timeout = watchdog, timeout
        self.key = f"{PREFIX}busy-{next(_REPORTS)}-"

    def wrap_backward(self, ctx: Any, backward: Callable[..., None]) -> Callable[..., None]:
        if self.watchdog is None:
            return backward
        call = self.watchdog.collectives.call

        def recorded(loss: Any, **kwargs: Any) -> None:
            # One call (DDP's all-reduce runs in C++ inside it, where no wrapper sees it), with
            # no shapes: the loss's are not those of the all-reduce.
            call(_BACKWARD_OPS.get(ctx.strategy.name, "backward"), backward, loss, **kwargs)

        return recorded

    def on_exit(self, ctx: Any, error: BaseException | None) -> None:
        if self.watchdog is not None:
            self._report_stragglers(self.watchdog, error)
            if error is not None and is_collective_failure(error) and self.watchdog.held_up():
                # The rank it waited for is stopped, as the watchdog said: this rank's timeout
                # is no cause of its own (its 25-line gloo traceback is kept in its error file,
                # and the launcher's last line names the stopped rank).
                worker_error.mark_consequence(error)
                return
        report_lost_peers(error)

    def on_teardown(self, ctx: Any) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
            uninstall()  # nothing is recorded now (the tap's last listener gives torch its own)

    def _report_stragglers(self, watchdog: Watchdog, error: BaseException | None) -> None:
        store, rank, calls = watchdog.store, watchdog.rank, watchdog.collectives
        mine = None if error is not None else (calls.busy_s, calls.steps)
        keys = [f"{self.key}{r}" for r in range(1, watchdog.world_size)]
        deadline = time.monotonic() + self.timeout.total_seconds()
        try:
            if rank != 0:
                store.set(f"{self.key}{rank}", json.dumps(mine))
                return
            if mine is None:
                return  # rank 0's block ended by an error: nothing to compare
            while not store.check(keys):
                if time.monotonic() >= deadline:
                    return  # a peer still busy: no report (polled: wait()'s timeout logs in C++)
                time.sleep(0.05)
            busy = [mine, *(json.loads(store.get(k)) for k in keys)]
        except Exception as e:  # a store that is gone (its host ended): no report
            log.debug("no straggler report: %s", e)
            return
        if None not in busy:
            for line in straggler_lines(busy):
                print(line, file=sys.stderr, flush=True)
