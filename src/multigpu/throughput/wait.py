"""How long the main thread waits on communication: the numerator of the collective-wait share.

Two sources, neither a profiler:

- **Python-level collectives** (``install()``): the clock listens to the tap on
  ``torch.distributed`` (``multigpu.runtime.collective_taps``: its collective and point-to-point
  functions and ``Work.wait``) while a Context of several processes lives (its teardown calls
  ``uninstall()``); the time the *main thread* spends inside them is added up (a nested call —
  ``all_gather_object`` calls ``all_gather`` — counts once). This is what FSDP2 waits on (its
  all-gathers and reduce-scatters go through ``dist.all_gather_single`` /
  ``dist.reduce_scatter_single`` and ``Work.wait``), the pipeline's sends and receives
  (``batch_isend_irecv`` and ``Work.wait``), a loss's ``num_items`` all-reduce and the gradient
  norm's.
- **DDP's gradient all-reduce** runs in C++ (its reducer) where no wrapper sees it; it overlaps
  the backward pass, and what is left when the last gradient is computed is the exposed wait:
  ``DDPTail`` times the last ``register_post_accumulate_grad_hook`` of the step to the end of
  ``backward`` (on CUDA, with two CUDA events on the current stream, read later).

What it misses: collectives called through names bound before ``install()`` (``from
torch.distributed import all_reduce``) or from C++ other than DDP's; waits on other threads; and
on CUDA every Python-level wait (NCCL calls return at once; the GPU waits, not the thread), so
on CUDA only DDP's tail is measured.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from multigpu.runtime import collective_taps


class WaitClock:
    """Seconds the main thread spent in the tap's calls (``collective_taps.TAPPED`` and
    ``Work.wait``) while it listened: a ``collective_taps.Listener``."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def begin(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
        """A call begins: when."""
        return time.perf_counter()

    def end(self, token: float, error: BaseException | None) -> None:
        """The call that began at ``token`` ended: its time is waiting."""
        self.seconds += time.perf_counter() - token


CLOCK = WaitClock()
"""This process's clock (the tap is process-wide, as ``torch.distributed`` is)."""


def install() -> WaitClock:
    """Time the tap's calls (the tap counts how many Contexts asked) until the matching
    ``uninstall``; the clock they feed."""
    collective_taps.listen(CLOCK)
    return CLOCK


def uninstall() -> None:
    """End one ``install``; after the last one nothing is timed."""
    collective_taps.unlisten(CLOCK)


class DDPTail:
    """The exposed part of DDP's gradient all-reduce: from the step's last gradient to the end of
    ``backward`` (see the module doc). ``seconds()`` adds up the finished steps' tails."""

    def __init__(self, model: nn.Module, cuda: bool) -> None:
        self.cuda = cuda
        self._last = 0.0  # perf_counter at the latest gradient (CPU)
        self._event: torch.cuda.Event | None = None  # the latest gradient's event (CUDA)
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._cpu_seconds = 0.0
        self._handles = [
            p.register_post_accumulate_grad_hook(self._gradient)
            for p in model.parameters()
            if p.requires_grad
        ]

    def _gradient(self, _: torch.Tensor) -> None:
        if self.cuda:
            if self._event is None:
                self._event = torch.cuda.Event(enable_timing=True)
            self._event.record()  # re-recorded by each gradient: the last one stays
        else:
            self._last = time.perf_counter()

    def backward_ended(self) -> None:
        """``backward`` returned (call right after it)."""
        if self.cuda:
            if self._event is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._pending.append((self._event, end))
                self._event = None
        elif self._last:
            self._cpu_seconds += time.perf_counter() - self._last
            self._last = 0.0

    def seconds(self) -> float:
        """The tails so far; on CUDA this waits for the last one's event (progress-line time)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self._cpu_seconds += sum(a.elapsed_time(b) / 1e3 for a, b in self._pending)
            self._pending.clear()
        return self._cpu_seconds

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for handle in self._handles:
            handle.remove()
