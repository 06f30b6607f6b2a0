"""The hang tools as Context hooks (``multigpu.hooks``): the watchdog, the straggler report and
the lost-peer report, attached by ``init()`` above one process (``multigpu.instrument``)."""

from __future__ import annotations

import itertools
import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from multigpu.hang.peers import report_lost_peers
from multigpu.hang.stragglers import straggler_lines
from multigpu.hang.watchdog import PREFIX, Watchdog
from multigpu.hooks import Hook

log = logging.getLogger(__name__)

# How the hang explainer names a backward pass: the collective it runs inside.
_BACKWARD_OPS = {
    "ddp": "backward (DDP gradient all-reduce)",
    "fsdp": "backward (FSDP all-gather and reduce-scatter)",
}

_REPORTS = itertools.count()
"""This process's straggler reports so far: the n-th of every rank meets under one key."""


class WatchdogHook(Hook):
    """Records each ``ctx.backward`` as one call (DDP's all-reduce runs in C++ inside it, where
    no wrapper sees it); stops the watchdog thread before the process group goes."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog

    def wrap_backward(self, ctx: Any, backward: Callable[..., None]) -> Callable[..., None]:
        call = self.watchdog.collectives.call

        def recorded(loss: Any, **kwargs: Any) -> None:
            # a call with no shapes: the loss's are not those of the all-reduce
            call(_BACKWARD_OPS.get(ctx.strategy.name, "backward"), backward, loss, **kwargs)

        return recorded

    def on_teardown(self, ctx: Any) -> None:
        self.watchdog.stop()


class StragglerReport(Hook):
    """At the end of a ``with`` block, rank 0 names a rank that computes slower (``stragglers``).

    A store exchange, not a collective: every other rank leaves its (busy seconds, steps) in the
    process group's store — or null, when its block ended by an error — and goes on at once;
    rank 0 polls for them at most ``timeout`` (the context's) and says nothing when one is
    missing. A peer that never comes can neither hold a finished rank longer nor fail it.
    """

    def __init__(self, watchdog: Watchdog, timeout: timedelta) -> None:
        self.watchdog, self.timeout = watchdog, timeout
        self.key = f"{PREFIX}busy-{next(_REPORTS)}-"

    def on_exit(self, ctx: Any, error: BaseException | None) -> None:
        store, rank = self.watchdog.store, self.watchdog.rank
        calls = self.watchdog.collectives
        mine = None if error is not None else (calls.busy_s, calls.steps)
        keys = [f"{self.key}{r}" for r in range(1, self.watchdog.world_size)]
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


class LostPeersHook(Hook):
    """After a collective failed, says which ranks still answer (``multigpu.hang.peers``)."""

    def on_exit(self, ctx: Any, error: BaseException | None) -> None:
        report_lost_peers(error)
